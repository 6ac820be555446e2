from django.urls import path

from notify import views

urlpatterns = [
    path("account/notifications/", views.notifications, name="notifications"),
    path("account/notifications/<int:pk>/delete/", views.channel_delete, name="notification-channel-delete"),
]

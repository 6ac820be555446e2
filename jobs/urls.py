"""Dashboard routes of the jobs app."""

from django.urls import path

from jobs import views

urlpatterns = [
    path("jobs/<int:pk>/", views.job_page, name="job"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job_cancel"),
    path("jobs/<int:pk>/priority/", views.job_priority, name="job_priority"),
    path("jobs/<int:pk>/release/", views.job_release, name="job_release"),
    path("teams/<slug:slug>/submit/", views.job_submit, name="job_submit"),
    path("arrays/<int:pk>/cancel/", views.array_cancel, name="array_cancel"),
    path("arrays/<int:pk>/priority/", views.array_priority, name="array_priority"),
]

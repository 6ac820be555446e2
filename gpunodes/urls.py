"""Dashboard routes of the gpunodes app."""

from django.urls import path

from gpunodes import views

urlpatterns = [
    path("nodes/", views.node_grid, name="nodes"),
    path("nodes/<str:name>/", views.node_page, name="node"),
    path("nodes/<str:name>/gpus/<int:index>/mark-healthy/", views.gpu_mark_healthy, name="gpu_mark_healthy"),
    path("nodes/<str:name>/<str:action>/", views.node_action, name="node_action"),
]

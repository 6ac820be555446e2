"""Dashboard routes of the quotas app: overview, teams, share configuration, audit log."""

from django.urls import path

from quotas import advice_views, org_views, sharing_views, views

urlpatterns = [
    path("", views.overview, name="overview"),
    path("teams/", views.team_list, name="team_list"),
    path("teams/<slug:slug>/", views.team_page, name="team"),
    path("shares/", views.share_list, name="share_list"),
    path("shares/new/", views.share_create, name="share_create"),
    path("shares/new/whatif/", views.share_whatif, name="share_whatif_new"),
    path("shares/<str:name>/", views.share_edit, name="share_edit"),
    path("shares/<str:name>/whatif/", views.share_whatif, name="share_whatif"),
    path("shares/<str:name>/sweep/", views.share_sweep, name="share_sweep"),
    path("whatif/<slug:run_id>/", views.whatif_run, name="whatif_run"),
    path("shares/<str:name>/state/", views.share_set_state, name="share_state"),
    path("shares/<str:name>/delete/", views.share_delete, name="share_delete"),
    path("layout/", views.share_layout, name="share_layout"),
    path("layout/plan/", views.share_layout_plan, name="share_layout_plan"),
    path("layout/versions/", views.share_layout_versions, name="share_layout_versions"),
    path("layout/plans/<uuid:plan_id>/", views.share_layout_plan_show, name="share_layout_plan_show"),
    path("layout/plans/<uuid:plan_id>/apply/", views.share_layout_apply, name="share_layout_apply"),
    path("audit/", views.audit_log, name="audit"),
    path("usage/", sharing_views.usage_page, name="usage"),
    path("organisation/", org_views.organisation_page, name="organisation"),
    path("advice/", advice_views.advice_page, name="advice"),
    path("advice/<slug:run_id>/", advice_views.advice_run, name="advice_run"),
    path("advice/<slug:run_id>/cancel/", advice_views.advice_cancel, name="advice_cancel"),
    path("advice/<slug:run_id>/plan/", advice_views.advice_plan, name="advice_plan"),
]

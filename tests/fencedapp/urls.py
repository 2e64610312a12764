from django.urls import path

from . import views

urlpatterns = [
    path("add/<str:name>/", views.add_after_pause),
    path("aadd/<str:name>/", views.aadd_after_pause),
]

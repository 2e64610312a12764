from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("", views.index, name="index"),
    path("transfer/", views.transfer, name="transfer"),
    path("reset/", views.reset, name="reset"),
]

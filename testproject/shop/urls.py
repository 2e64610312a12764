from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("", views.index, name="index"),
    path("transfer/", views.transfer, name="transfer"),
    path("balances/", views.balances, name="balances"),
    path("reset/", views.reset, name="reset"),
    path("seats/", views.seats, name="seats"),
    path("seats/<int:show_id>/book/", views.book, name="book"),
    path("seats/<int:show_id>/book/unsafe/", views.book_unsafe, name="book_unsafe"),
    path("seats/reset/", views.reset_seats, name="reset_seats"),
    path("metrics/", views.metrics, name="metrics"),
]

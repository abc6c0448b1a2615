from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("", views.index, name="index"),
    path("buy/<int:pk>/", views.buy, name="buy"),
    path("abuy/<int:pk>/", views.abuy, name="abuy"),
    path("orders/", views.orders, name="orders"),
    path("orders/<int:pk>/invoice/", views.invoice, name="invoice"),
    path("load/", views.start_load, name="load"),
]

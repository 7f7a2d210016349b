"""A Django project in one file: settings, a task, an enqueue in transaction.atomic()."""

import tempfile

import django
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction

from txtasks import App

# settings.py
settings.configure(
    DATABASES={
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": f"{tempfile.mkdtemp()}/db.sqlite3",
        }
    },
    INSTALLED_APPS=["txtasks.contrib.django"],
    TXTASKS_APP="__main__:app",  # "module:attribute" of your App, e.g. "shop.tasks:app"
    TXTASKS_DATABASE="default",  # the Django database the txtasks tables live in
)
django.setup()

# shop/tasks.py: the App needs no database URL, the commands pass the Django database's.
app = App("shop")
sent: list[str] = []


@app.task(queue="emails")
def send_receipt(payload: dict) -> None:
    sent.append(payload["email"])


call_command("txtasks_migrate")  # `python manage.py txtasks_migrate`
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, email TEXT NOT NULL)")

# shop/views.py
from txtasks.contrib.django import enqueue  # noqa: E402


def place_order(email: str) -> int:
    with transaction.atomic():  # the order and its task commit together, or not at all
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders (email) VALUES (%s)", [email])
        return enqueue(send_receipt, {"email": email})  # wakes a worker on commit


place_order("ada@example.com")
try:
    with transaction.atomic():
        enqueue(send_receipt, {"email": "rolled-back@example.com"})
        raise RuntimeError("payment refused")
except RuntimeError:
    pass  # rolled back: no task, no wake-up

# `python manage.py txtasks_worker --burst` (without --burst it runs until stopped)
call_command("txtasks_worker", "--burst", "--burst-horizon", "0")
assert sent == ["ada@example.com"]

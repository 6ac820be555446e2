"""Create the first admin if there is none, and print its password once."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create a superuser named --username when no superuser exists; print its password once."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write("an admin already exists; its password was printed when it was created")
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email=f"{username}@localhost", password=password)
        self.stdout.write(self.style.SUCCESS(f"admin user: {username}  password: {password}  (shown once)"))

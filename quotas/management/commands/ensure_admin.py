"""Create the first admin if there is none; its password goes to var/credentials.txt (0600)."""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from quotas.credentials import credentials_path, remember_credentials


class Command(BaseCommand):
    help = "Create a superuser named --username when no superuser exists; keep its password in var/."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username, **options):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            self.stdout.write(f"an admin already exists (sign-in: {credentials_path()})")
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email=f"{username}@localhost", password=password)
        path = remember_credentials(username, password, "admin")
        self.stdout.write(self.style.SUCCESS(f"admin user {username} created; its password is in {path}"))

"""Serializers of GPU hosts."""

from rest_framework import serializers

from gpunodes.models import Node


class NodeSerializer(serializers.ModelSerializer):
    gpus = serializers.IntegerField(source="gpu_count", read_only=True, help_text="GPUs on the node.")
    gpus_in_use = serializers.IntegerField(read_only=True, help_text="GPUs held by live attempts.")

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "gpu_type",
            "gpus",
            "gpus_in_use",
            "state",
            "hostname",
            "last_heartbeat",
            "agent_version",
            "labels",
            "registered_at",
            "state_changed_at",
        ]
        read_only_fields = fields

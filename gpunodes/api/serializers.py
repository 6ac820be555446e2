"""Serializers of GPU hosts and their GPUs."""

from rest_framework import serializers

from gpunodes.models import Gpu, Node


class GpuSerializer(serializers.ModelSerializer):
    reason = serializers.CharField(
        source="health_reason", read_only=True, help_text="Why it is not healthy (xid, ecc, off_bus...)."
    )
    detail = serializers.CharField(source="health_detail", read_only=True, help_text="The reason in words.")
    since = serializers.DateTimeField(
        source="health_changed_at", read_only=True, help_text="When its health last changed."
    )

    class Meta:
        model = Gpu
        fields = ["index", "uuid", "model", "memory_mb", "health", "reason", "detail", "since"]
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer):
    gpus = serializers.IntegerField(source="gpu_count", read_only=True, help_text="GPUs on the node.")
    gpus_in_use = serializers.IntegerField(read_only=True, help_text="GPUs held by live attempts.")
    gpus_unhealthy = serializers.IntegerField(
        read_only=True,
        help_text="GPUs out of capacity: found broken by the node's agent (UNHEALTHY), or marked healthy "
        "and waiting for its re-check (CHECKING). Their reasons: the node's gpu_list.",
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "gpu_type",
            "gpus",
            "gpus_in_use",
            "gpus_unhealthy",
            "state",
            "hostname",
            "address",
            "last_heartbeat",
            "agent_version",
            "labels",
            "registered_at",
            "state_changed_at",
        ]
        read_only_fields = fields


class NodeDetailSerializer(NodeSerializer):
    """One node, with each of its GPUs and its health."""

    gpu_list = GpuSerializer(source="gpus", many=True, read_only=True)

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "gpu_list"]
        read_only_fields = fields

"""The host's image cache: over its cap, the least recently used images go first, never one a container
uses (running or not yet removed), never the one about to start."""

import subprocess
import tarfile
import uuid

from gpunodes.agent.containers import ImageCache
from tests.containers.conftest import needs_podman, rootfs_tar

pytestmark = needs_podman


def distinct_image(podman, tmp_path, tag: str) -> str:
    """An image of its own content (its own id): the test rootfs plus a file naming it."""
    tar = rootfs_tar(tmp_path / f"{tag}.tar")
    marker = tmp_path / f"{tag}.txt"
    marker.write_text(tag)
    with tarfile.open(tar, "a") as t:
        t.add(marker, "etc/which")
    name = f"localhost/gpuquota-test/cache-{tag}:1"
    subprocess.run(
        [*podman.base(), "import", "--change", "ENV=PATH=/bin", tar, name], check=True, capture_output=True
    )
    return name


def test_the_least_recently_used_images_go_first_never_one_in_use(podman, tmp_path):
    tags = [uuid.uuid4().hex[:8] for _ in range(4)]
    busy, old, mid, new = (distinct_image(podman, tmp_path, t) for t in tags)
    container = f"gpuquota-test-cache-{tags[0]}"
    cache = ImageCache(podman, tmp_path / "images.json", cap_bytes=1)
    try:
        podman._run("create", "--name", container, busy, "sleep", "60")  # uses `busy`, the oldest
        for name in (busy, old, mid, new):
            cache.used(name)
        # The host's other images (other tests', an operator's) count as used since: never touched here.
        for i in podman.images():
            for name in set(i["names"]) - {busy, old, mid, new}:
                cache.used(name)
        sizes = {n: i["size"] for i in podman.images() for n in i["names"]}
        # A cap one image under what the host holds: the least recently used that may go, goes.
        cache.cap_bytes = sum(i["size"] for i in podman.images()) - sizes[old]
        assert cache.prune(keep={new}) == [old]
        assert podman.has_image(mid) and not podman.has_image(old)
        cache.cap_bytes = sum(i["size"] for i in podman.images()) - sizes[mid]
        assert cache.prune(keep={new}) == [mid]
        assert podman.has_image(busy) and podman.has_image(new)
        # Under the cap nothing goes.
        cache.cap_bytes = 1 << 40
        assert cache.prune() == []
    finally:
        podman.remove(container)
        for name in (busy, old, mid, new):
            podman._run("rmi", "-f", name)

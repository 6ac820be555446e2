"""gpuquota's Python client and the `gpuquota` command line. Needs only the standard library.

from gpuquota_client import Client
client = Client("http://127.0.0.1:8000", token="...")
job = client.submit(share="vision-main", gpus=2, gpu_type="a10g", command=["python", "train.py"])
client.wait(job["id"])
"""

__all__ = ["ApiError", "Client", "ClientError"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported on first use: `gpuquota --version` must not pay for the HTTP machinery.
    if name in __all__:
        from gpuquota_client import client

        return getattr(client, name)
    raise AttributeError(f"module 'gpuquota_client' has no attribute {name!r}")

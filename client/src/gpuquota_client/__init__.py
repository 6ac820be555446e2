"""gpuquota's Python client and the `gpuquota` command line. Needs only `requests`.

from gpuquota_client import Client
client = Client("http://127.0.0.1:8000", token="...")
job = client.submit(share="vision-main", gpus=2, gpu_type="a10g", command=["python", "train.py"])
client.wait(job["id"])
"""

from gpuquota_client.client import ApiError, Client, ClientError

__all__ = ["ApiError", "Client", "ClientError"]
__version__ = "0.1.0"

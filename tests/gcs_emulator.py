"""A local GCS stand-in for tests: the `gcp-storage-emulator` package's server with the two
generation behaviours of the real object API that tensorstore relies on patched in.

The emulator (2026.7.19) gets two things wrong that tensorstore's `gcs` kvstore depends on:
- A media read (`GET .../o/KEY?alt=media`) carries no `x-goog-generation` header, so
  tensorstore takes the value's generation to be 0 (`SetObjectMetadataFromHeaders`). A later
  conditional write with that generation is refused by tensorstore before it leaves the
  process: `Malformed StorageGeneration` (`IsValidStorageGeneration` wants a uint64 > 0). This
  is what OCDBT's manifest update does whenever the manifest it updates was read rather than
  written by the same handle.
- `ifGenerationMatch` / `ifGenerationNotMatch` are ignored: a stale conditional write
  succeeds, and a cached read is never answered `304 Not Modified`. Together with the first:
  when tensorstore revalidates the manifest it has just written (`ifGenerationNotMatch=G`,
  timing-dependent), it gets 200 without a generation instead of 304, and its next commit
  fails as above: an orbax save in tests/test_gcs_chain.py failed in about half the runs.

`start()` patches both into the server's route table (reads: the headers, `412` / `304`;
writes and deletes: `412`), as the real service documents them
(https://cloud.google.com/storage/docs/request-preconditions). The server handles one request
at a time (`http.server.HTTPServer`), so a check and the write after it are atomic.
"""

from http import HTTPStatus

from gcp_storage_emulator import server as server_lib
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects


def _current_generation(storage, bucket, name):
  """The object's live generation as an int; 0 when there is none (GCS's `=0` condition)."""
  try:
    return int(storage.get_file_obj(bucket, name)["generation"])
  except NotFound:
    return 0


def _object_name(request, storage):
  """The object a read, upload (any uploadType, or a resumable upload's chunk) or delete names."""
  if request.params.get("object_id"):
    return request.params["object_id"]
  if "name" in request.query:
    return request.query["name"][0]
  if "upload_id" in request.query:
    return storage.get_resumable_file_obj(request.query["upload_id"][0])["name"]
  data = request.data
  if isinstance(data, dict):  # multipart upload: {"meta": ..}; resumable start: the resource
    return (data.get("meta") or data).get("name")
  return None


def _refused(request, storage, read):
  """The status a generation precondition of `request` answers, or None when it holds."""
  match = request.query.get("ifGenerationMatch")
  not_match = request.query.get("ifGenerationNotMatch")
  if not match and not not_match:
    return None
  name = _object_name(request, storage)
  if name is None:
    return None
  generation = _current_generation(storage, request.params["bucket_name"], name)
  if read and generation == 0:
    return None  # the handler answers 404 for a missing object
  if match and int(match[0]) != generation:
    return HTTPStatus.PRECONDITION_FAILED
  if not_match and int(not_match[0]) == generation:
    return HTTPStatus.NOT_MODIFIED if read else HTTPStatus.PRECONDITION_FAILED
  return None


def _with_preconditions(handler, read):
  def patched(request, response, storage, *args, **kwargs):
    status = _refused(request, storage, read)
    if status is not None:
      response.status = status
      if status == HTTPStatus.PRECONDITION_FAILED:
        message = "At least one of the pre-conditions you specified did not hold."
        response.json({"error": {"code": 412, "message": message}})
      return None
    result = handler(request, response, storage, *args, **kwargs)
    if read and response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
      try:  # the object's generation on every read, as the real service sends it
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
      except NotFound:
        return result
      response["x-goog-generation"] = str(obj["generation"])
      response["x-goog-metageneration"] = str(obj["metageneration"])
    return result

  return patched


_PATCHED = {}


def _patch_routes():
  """Replaces the object handlers in the server's route table (once per process)."""
  if _PATCHED:
    return
  reads = (objects.get, objects.download)
  writes = (objects.insert, objects.upload_partial, objects.xml_upload, objects.delete)
  for handler in reads + writes:
    _PATCHED[handler] = _with_preconditions(handler, read=handler in reads)
  placed = set()
  for _, handlers in server_lib.HANDLERS:
    for method, handler in handlers.items():
      if handler in _PATCHED:
        handlers[method] = _PATCHED[handler]
        placed.add(handler)
  missing = sorted(h.__name__ for h in set(_PATCHED) - placed)
  # Another emulator version may route differently: fail loudly rather than test unpatched.
  assert not missing, f"gcp-storage-emulator routes no longer use objects.{missing}"


def start(port, data_dir, bucket="bucket"):
  """A started emulator on 127.0.0.1:`port` with `bucket`, its objects under `data_dir`
  (`data_dir/.cloudstorage/BUCKET/KEY`); call `.stop()` on it."""
  _patch_routes()
  server = server_lib.create_server(
    "127.0.0.1", port, in_memory=False, default_bucket=bucket, data_dir=str(data_dir)
  )
  server.start()
  return server

"""A Schema Registry on 127.0.0.1 that answers the one call the worker makes: a schema by id.

``GET /schemas/ids/<id>?format=serialized`` → ``{"schemaType", "schema"}`` as Confluent
Schema Registry answers it (the schema a base64 ``FileDescriptorProto``), 404 with
error code 40403 for an id it does not hold. ``delay_s`` makes it slow.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import descriptor_pb2

from ktimers import timers_pb2


def timers_proto() -> descriptor_pb2.FileDescriptorProto:
    """proto/timers.proto as a registry holds it."""
    proto = descriptor_pb2.FileDescriptorProto()
    timers_pb2.DESCRIPTOR.CopyToProto(proto)
    return proto


@dataclass
class RegistryStub:
    schemas: dict[int, tuple[str, str]] = field(default_factory=dict)  # id → (type, schema text)
    delay_s: float = 0.0
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def add(self, schema_id: int, proto: descriptor_pb2.FileDescriptorProto) -> None:
        self.schemas[schema_id] = ("PROTOBUF", base64.b64encode(proto.SerializeToString()).decode())


@contextmanager
def registry_stub() -> Iterator[RegistryStub]:
    stub = RegistryStub()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server hook
            stub.requests.append(self.path)
            time.sleep(stub.delay_s)
            found = re.fullmatch(r"/schemas/ids/(\d+)\?format=serialized", self.path)
            held = stub.schemas.get(int(found.group(1))) if found else None
            if held is None:
                self._answer(404, {"error_code": 40403, "message": "Schema not found"})
            else:
                self._answer(200, {"schemaType": held[0], "schema": held[1]})

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # the client gave up waiting (a slow registry's test)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()

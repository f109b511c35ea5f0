"""Adapters a tenant hands over: a multipart upload, or a source URI the server reads.

`POST /v1/adapters` with `multipart/form-data` carries two file parts, named
`adapter_config.json` and `adapter_model.safetensors` (as PEFT's `save_pretrained` writes
them), and the fields `name`, `public` and `replace`. The body is read straight from the
connection, part by part, into a staging directory: each file is hashed as it streams and
reading stops at its limit (`--max-adapter-bytes` for the weights, `CONFIG_LIMIT` for the
config), so an oversized upload costs the server no more than the limit. A Content-Length
over what a valid upload can be is refused before anything is read.

The staged files are then validated exactly as a registered directory is
(`loragate.adapters.load_adapter`: base model, shapes, ranks, patterns, no pickle), written
into the adapter store under their hash, loaded by the engine by that hash, and only then
registered: until the registration lands nothing is visible, and a failure at any step
leaves no object, no record and the tenant's quota as it was.

A source (`{"name", "source": "s3://bucket/key/" | "file:///dir"}`) takes the same path
from the staging directory on; `file://` only under the caller's part of --adapter-root.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import multipart

from loragate.adapters import AdapterError, LoRAModelSpec, load_adapter
from loragate.adapters.identity import CONFIG_FILE, WEIGHTS_FILE
from loragate.adapters.store import (
    AdapterStoreError,
    ObjectNotFoundError,
    S3Store,
    SourceTooLargeError,
    hash_file,
)
from loragate.gateway.adapter_control.adapter_store_objects import (
    AdapterObjects,
    AdapterStoreUnavailableError,
)
from loragate.gateway.adapter_control.manager import AdapterManager
from loragate.gateway.adapter_control.paths import AdapterPathError, resolve_adapter_dir
from loragate.gateway.adapter_control.served_adapters import UPLOAD_PATH, AdapterRecord
from loragate.gateway.errors import APIError, InvalidRequestError, QuotaExceededError
from loragate.gateway.tenancy.principal import Principal
from loragate.registry import adapter_key

CONFIG_LIMIT = 1 << 20  # adapter_config.json: a few KB in practice
FIELD_LIMIT = 1024  # name, public, replace
FORM_OVERHEAD = 64 << 10  # boundaries and part headers
HEADROOM = 1 << 20  # the safetensors header and metadata on top of the tensors
PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"PK\x03\x04")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class PayloadTooLargeError(APIError):
    """413; the connection is closed after it, so the rest of the body is never read."""

    status_code = 413
    error_type = "invalid_request_error"

    def __init__(self, message: str, **kw):
        super().__init__(message, headers={"Connection": "close"}, **kw)


def default_max_adapter_bytes(spec: LoRAModelSpec | None, max_lora_rank: int) -> int:
    """The largest float32 adapter of rank `max_lora_rank` on every LoRA-targetable module
    of every layer (A is r x d_in, B is d_out x r), plus HEADROOM for its header."""
    if spec is None:
        return HEADROOM
    per_layer = sum(d_in + d_out for d_in, d_out in spec.modules.values())
    return spec.num_layers * per_layer * max(max_lora_rank, 1) * 4 + HEADROOM


@dataclass
class StagedAdapter:
    """An adapter's two files in a staging directory, hashed; `fields` the form's fields."""

    directory: Path
    oid: str
    size_bytes: int
    fields: dict[str, str]


class _Part:
    """One file part being written to disk and hashed, refused past `limit` bytes."""

    def __init__(self, name: str, path: Path, limit: int):
        self.name, self.path, self.limit = name, path, limit
        self.file = open(path, "wb")  # noqa: SIM115 - closed by `close`
        self.digest = hashlib.sha256()
        self.size = 0
        self.head = b""

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise PayloadTooLargeError(
                f"{self.name} is over the limit of {self.limit} bytes; reading stopped there",
                param=self.name,
                code="adapter_too_large",
            )
        if len(self.head) < 8:
            self.head += chunk[:8]
        self.digest.update(chunk)
        self.file.write(chunk)

    def close(self) -> None:
        self.file.close()


class AdapterUploads:
    def __init__(
        self,
        manager: AdapterManager,
        objects: AdapterObjects,
        staging_root: Path,
        max_adapter_bytes: int,
        strict_base_model: bool = False,
    ):
        self.manager = manager
        self.objects = objects
        self.staging_root = staging_root
        self.max_adapter_bytes = max_adapter_bytes
        self.strict_base_model = strict_base_model

    # ---- receiving ----------------------------------------------------------------------
    async def receive(self, receive, content_type: str, content_length: int | None):
        """Stream a multipart body (ASGI `receive`) into a staging directory."""
        _, options = multipart.parse_options_header(content_type)
        boundary = options.get("boundary")
        if not boundary:
            raise InvalidRequestError(
                "a multipart/form-data body needs a boundary in its Content-Type",
                code="invalid_multipart",
            )
        most = self.max_adapter_bytes + CONFIG_LIMIT + FORM_OVERHEAD
        if content_length is not None and content_length > most:
            raise PayloadTooLargeError(
                f"the body is {content_length} bytes; an adapter upload is at most {most} "
                f"(adapter_model.safetensors at most {self.max_adapter_bytes}); nothing was read",
                param=WEIGHTS_FILE,
                code="adapter_too_large",
            )
        directory = self._staging()
        try:
            return await self._parse(receive, boundary, directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise

    def _staging(self) -> Path:
        self.staging_root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=".upload-", dir=self.staging_root))

    async def _parse(self, receive, boundary: str, directory: Path) -> StagedAdapter:
        limits = {CONFIG_FILE: CONFIG_LIMIT, WEIGHTS_FILE: self.max_adapter_bytes}
        parts: dict[str, _Part] = {}
        fields: dict[str, bytearray] = {}
        current = None
        parser = multipart.PushMultipartParser(boundary, max_segment_count=8)
        try:
            async for chunk in _body(receive):
                for event in parser.parse(chunk):
                    if isinstance(event, multipart.MultipartSegment):
                        current = self._open(event, limits, parts, fields, directory)
                    elif event is None:
                        current = None
                    elif isinstance(current, _Part):
                        current.write(event)
                    else:
                        value = fields[current]
                        value += event
                        if len(value) > FIELD_LIMIT:
                            raise InvalidRequestError(
                                f"form field {current!r} is over {FIELD_LIMIT} bytes",
                                param=current,
                            )
            parser.close()
        except multipart.ParserError as exc:
            raise InvalidRequestError(
                f"the multipart body is malformed or incomplete ({exc}); nothing was stored",
                code="invalid_multipart",
            ) from exc
        finally:
            for part in parts.values():
                part.close()
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if name not in parts:
                raise InvalidRequestError(
                    f"the upload has no {name} part: send the adapter's {CONFIG_FILE} and "
                    f"{WEIGHTS_FILE} as file parts of those names",
                    param=name,
                    code="missing_file",
                )
        if parts[WEIGHTS_FILE].head.startswith(PICKLE_MAGIC):
            raise InvalidRequestError(
                f"{WEIGHTS_FILE} is a pickle file (torch.save); pickles are never loaded "
                "because unpickling can run code: save the adapter as safetensors",
                param=WEIGHTS_FILE,
                code="pickle_weights",
            )
        weights, config = parts[WEIGHTS_FILE], parts[CONFIG_FILE]
        oid = f"{weights.digest.hexdigest()}-{config.digest.hexdigest()}"
        values = {k: v.decode("utf-8", "replace") for k, v in fields.items()}
        return StagedAdapter(directory, oid, weights.size, values)

    def _open(self, segment, limits, parts, fields, directory):
        name = segment.name
        if name in limits:
            if name in parts:
                raise InvalidRequestError(f"the part {name!r} is sent twice", param=name)
            parts[name] = _Part(name, directory / name, limits[name])
            return parts[name]
        if name in ("name", "public", "replace"):
            if segment.filename is not None:
                raise InvalidRequestError(f"{name!r} must be a form field, not a file", param=name)
            if name in fields:
                raise InvalidRequestError(f"the field {name!r} is sent twice", param=name)
            fields[name] = bytearray()
            return name
        hint = ""
        if segment.filename and segment.filename.lower().endswith(PICKLE_SUFFIXES):
            hint = " (pickle weights are never loaded: send adapter_model.safetensors)"
        raise InvalidRequestError(
            f"unexpected form part {name!r}{hint}; an upload has the file parts "
            f"{CONFIG_FILE!r} and {WEIGHTS_FILE!r} and the fields 'name', 'public', 'replace'",
            param=name,
            code="unexpected_part",
        )

    # ---- registering --------------------------------------------------------------------
    async def register_upload(self, staged: StagedAdapter, caller: Principal) -> AdapterRecord:
        fields = staged.fields
        if "name" not in fields:
            raise InvalidRequestError("the form field 'name' is missing", param="name")
        return await self.register_staged(
            staged,
            fields["name"],
            caller,
            public=_flag(fields, "public", None),
            replace=bool(_flag(fields, "replace", False)),
            source="upload",
            shown=UPLOAD_PATH,
        )

    async def register_staged(
        self,
        staged: StagedAdapter,
        name: str,
        caller: Principal,
        public: bool | None,
        replace: bool,
        source: str,
        shown: str,
    ) -> AdapterRecord:
        """Validate the staged files, keep them in the store, register `name` for them."""
        try:
            owner, bare, _ = await self.manager.prepare(name, caller, public, replace)
            await self._check_room(owner, bare, staged.size_bytes)
            await asyncio.to_thread(self._validate, staged.directory)
            async with self.objects.kept(staged.oid, staged.directory):
                return await self.manager.register_object(
                    name, staged.oid, shown, source, caller, public, replace
                )
        finally:
            shutil.rmtree(staged.directory, ignore_errors=True)

    def _validate(self, directory: Path) -> None:
        model = self.manager.engine.model_info
        try:
            load_adapter(directory, model.lora_spec, model.max_lora_rank, self.strict_base_model)
        except AdapterError as exc:
            message = str(exc).replace(str(directory) + "/", "").replace(str(directory), "upload")
            raise InvalidRequestError(
                f"invalid adapter: {message}",
                param=exc.field or WEIGHTS_FILE,
                code="invalid_adapter",
            ) from exc

    async def _check_room(self, owner: str | None, name: str, size: int) -> None:
        """Refuse early what the registry would refuse anyway (it checks again, atomically)."""
        if owner is None:
            return
        tenant = await self.manager.store.get_tenant(owner)
        if tenant is None:
            return
        quota = tenant.quota
        # The registry's counters of the tenant's adapters (no scan), and the one replaced.
        counts = await self.manager.store.adapter_counts(owner)
        replaced = await self.manager.store.get_adapter(adapter_key(owner, name))
        if (
            replaced is None
            and quota.max_adapters is not None
            and counts.adapters >= quota.max_adapters
        ):
            raise QuotaExceededError(
                f"this tenant already owns its maximum of {quota.max_adapters} adapters; "
                "delete one before registering another",
                param="name",
                code="max_adapters",
                headers={"Retry-After": "60"},
            )
        if quota.max_adapter_bytes is not None:
            used = counts.size_bytes - (replaced.size_bytes if replaced else 0)
            if used + size > quota.max_adapter_bytes:
                raise QuotaExceededError(
                    f"this tenant's adapters hold {used} bytes; {size} more would pass its "
                    f"max_adapter_bytes of {quota.max_adapter_bytes}: delete an adapter first",
                    param=WEIGHTS_FILE,
                    code="max_adapter_bytes",
                    headers={"Retry-After": "60"},
                )

    # ---- sources by URI -----------------------------------------------------------------
    async def register_source(
        self, name: str, source: str, caller: Principal, public: bool | None, replace: bool
    ) -> AdapterRecord:
        directory = self._staging()
        try:
            await self._read_source(source, caller, directory)
            staged = await asyncio.to_thread(self._hashed, directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return await self.register_staged(
            staged, name, caller, public, replace, source="source", shown=source
        )

    async def _read_source(self, source: str, caller: Principal, directory: Path) -> None:
        scheme = urlsplit(source).scheme if isinstance(source, str) else ""
        if scheme == "file":
            root = self.manager.root_of(caller.tenant)
            try:
                folder = resolve_adapter_dir(root, unquote(urlsplit(source).path))
            except AdapterPathError as exc:
                raise InvalidRequestError(str(exc), param="source", code="invalid_path") from exc
            await asyncio.to_thread(self._copy_folder, folder, directory)
        elif scheme == "s3":
            reader = self.objects.objects
            if not isinstance(reader, S3Store):
                reader = S3Store("s3://source")  # a client as boto3 configures it
            try:
                await asyncio.to_thread(
                    reader.read_source, source, directory, self.max_adapter_bytes
                )
            except SourceTooLargeError as exc:
                raise PayloadTooLargeError(
                    str(exc), param="source", code="adapter_too_large"
                ) from exc
            except ObjectNotFoundError as exc:
                raise InvalidRequestError(
                    str(exc), param="source", code="source_not_found"
                ) from exc
            except AdapterStoreError as exc:
                raise AdapterStoreUnavailableError(str(exc), code="source_unreachable") from exc
        else:
            raise InvalidRequestError(
                f"source must be an s3://bucket/key/ or file:/// URI, got {source!r} "
                "(hf:// is not supported: this server reaches no model hub)",
                param="source",
                code="invalid_source",
            )

    def _copy_folder(self, folder: Path, directory: Path) -> None:
        for name, limit in ((CONFIG_FILE, CONFIG_LIMIT), (WEIGHTS_FILE, self.max_adapter_bytes)):
            path = folder / name
            if path.is_file() and path.stat().st_size > limit:
                raise PayloadTooLargeError(
                    f"{name} is {path.stat().st_size} bytes; at most {limit} are accepted",
                    param="source",
                    code="adapter_too_large",
                )
            if path.is_file():
                shutil.copyfile(path, directory / name)

    def _hashed(self, directory: Path) -> StagedAdapter:
        digests, size = {}, 0
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise InvalidRequestError(
                    f"the source has no {name}", param="source", code="missing_file"
                )
            digests[name], got = hash_file(directory / name)
            if name == WEIGHTS_FILE:
                size = got
        return StagedAdapter(directory, f"{digests[WEIGHTS_FILE]}-{digests[CONFIG_FILE]}", size, {})


async def _body(receive):
    """The request body's chunks as they arrive; ends early if the client goes away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequestError(
                "the client went away before the body ended; nothing was stored",
                code="incomplete_body",
            )
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def _flag(fields: dict, name: str, default):
    if name not in fields:
        return default
    value = fields[name].strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise InvalidRequestError(
        f"form field {name!r} must be true or false, got {value!r}", param=name
    )

"""`loragate registry export FILE` and `loragate registry import FILE [--merge]`: the registry
store of a Redis deployment (tenants with their quotas and weights, key digests, adapter
records, usage counts) to a backup file and back (loragate.registry.backup does the work).

An in-memory registry lives inside its server process, so these commands need the Redis
URL (the one `serve --redis-url` uses, or LORAGATE_REDIS_URL) and its namespace.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from loragate.registry import RegistryError, make_registry_store
from loragate.registry.backup import (
    BackupFileError,
    export_registry,
    import_backup,
    read_backup,
)


def _store_options(command):
    command = click.option(
        "--redis-namespace",
        default="loragate",
        show_default=True,
        help="Prefix of the deployment's Redis keys (serve's --redis-namespace).",
    )(command)
    return click.option(
        "--redis-url",
        required=True,
        envvar="LORAGATE_REDIS_URL",
        show_envvar=True,
        help="The deployment's Redis (serve's --redis-url): redis://host:port/db.",
    )(command)


@click.group()
def registry() -> None:
    """Back up and restore the registry store: tenants, key digests, adapters, usage."""


@registry.command("export")
@click.argument("file", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@_store_options
def export_command(file: Path, redis_url: str, redis_namespace: str) -> None:
    """Write the registry to FILE (JSON lines; replaced atomically). Keys are written only
    as their salted digests: the file restores them, and never holds one."""

    async def run():
        store = _store(redis_url, redis_namespace)
        try:
            return await export_registry(store, file, source=store.where)
        finally:
            await store.close()

    written = _run(run())
    snapshot = written.snapshot
    click.echo(
        f"exported {len(snapshot.tenants)} tenants ({len(snapshot.keys)} keys), "
        f"{len(snapshot.adapters)} adapters and the usage counts of {len(snapshot.usage)} "
        f"tenants to {file}"
    )


@registry.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--merge",
    is_flag=True,
    help="Import into a store that is not empty: add what it lacks, keep its own records "
    "where they differ, add usage counts it lost.",
)
@click.option(
    "--dry-run", is_flag=True, help="Check the file and say what would be imported; write nothing."
)
@_store_options
def import_command(
    file: Path, merge: bool, dry_run: bool, redis_url: str, redis_namespace: str
) -> None:
    """Restore the registry from FILE (written by `export` or --registry-backup-dir). Into an
    empty store it restores exactly what was exported; old keys keep working."""
    try:
        backup = read_backup(file)
    except BackupFileError as exc:
        raise click.ClickException(f"{file} is refused: {exc}") from exc

    async def run():
        store = _store(redis_url, redis_namespace)
        try:
            await store.open()
            return await import_backup(store, backup, merge=merge, dry_run=dry_run)
        finally:
            await store.close()

    click.echo(_run(run()).describe())


def _store(redis_url: str, namespace: str):
    try:
        return make_registry_store(redis_url, namespace=namespace)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--redis-url") from exc


def _run(work):
    try:
        return asyncio.run(work)
    except (RegistryError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc

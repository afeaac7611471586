"""Checkpoint files from a local directory or the Hugging Face Hub, with errors that say what to do."""

from __future__ import annotations

import os
from pathlib import Path

from zonos.errors import CheckpointError


class CheckpointNotAvailableError(CheckpointError, FileNotFoundError):
    """A checkpoint file is neither in the given directory nor obtainable from the Hub or its cache."""


def resolve_file(
    repo_or_dir: str | os.PathLike,
    filename: str,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """Path of ``filename`` in a local directory, or in the Hub cache (downloading it when online).

    Raises :class:`CheckpointNotAvailableError` naming the file and how to get it onto this machine.
    """
    local = Path(repo_or_dir).expanduser()
    if local.is_dir():
        path = local / filename
        if not path.is_file():
            raise CheckpointNotAvailableError(
                f"{local} has no {filename}; download the repo into it with `hf download <repo id> --local-dir {local}`"
            )
        return path
    repo_id = str(repo_or_dir)
    if _looks_like_path(repo_id) or _parent_is_local_dir(repo_id):
        what = "is a file, not a directory" if local.exists() else "does not exist"
        raise CheckpointNotAvailableError(
            f"{repo_id} {what}: pass a local directory holding the checkpoint's files ({filename} among them), or a "
            "Hugging Face repo id such as Zyphra/Zonos-v0.1-hybrid"
        )

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir))
    except HFValidationError as e:
        raise CheckpointNotAvailableError(
            f"{repo_id!r} is neither a local directory nor a valid Hugging Face repo id (namespace/name, such as "
            f"Zyphra/Zonos-v0.1-hybrid): {e}"
        ) from e
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, HfHubHTTPError, OSError) as e:
        where = f" at {cache_dir}" if cache_dir else ""
        raise CheckpointNotAvailableError(
            f"could not get {filename} of {repo_id!r} (revision {revision or 'main'}) from the Hugging Face Hub "
            f"or its cache{where}: {e}\n"
            f"To fix: on a machine with internet access run `hf download {repo_id}` (older huggingface_hub: "
            "`huggingface-cli download`) and copy the cache over or point HF_HOME / cache_dir at it; or unset "
            f"HF_HUB_OFFLINE if you are online; or download with `--local-dir DIR` and pass DIR instead of "
            f"{repo_id!r} (from_pretrained(DIR) or from_local)."
        ) from e


def _looks_like_path(name: str) -> bool:
    """A local path rather than a repo id (``namespace/name``): relative or absolute, home-relative, an existing
    file, or more than one directory level."""
    windows = os.sep != "/" and os.sep in name
    return name.startswith((".", "/", "~")) or Path(name).exists() or name.count("/") > 1 or windows


def _parent_is_local_dir(name: str) -> bool:
    """``models/zonos`` where ``models/`` is a local directory: a mistyped local path, not a repo id (a Hub
    lookup of it would cost network retries, ~23 s offline, before failing)."""
    parent = Path(name).expanduser().parent
    return str(parent) not in ("", ".") and parent.is_dir()

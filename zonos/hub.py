"""Checkpoint files from a local directory or the Hugging Face Hub, with errors that say what to do."""

from __future__ import annotations

import os
from pathlib import Path


class CheckpointNotAvailableError(FileNotFoundError):
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
    local = Path(repo_or_dir)
    if local.is_dir():
        path = local / filename
        if not path.is_file():
            raise CheckpointNotAvailableError(
                f"{local} has no {filename}; download the repo into it with `hf download <repo id> --local-dir {local}`"
            )
        return path

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    repo_id = str(repo_or_dir)
    try:
        return Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_dir))
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

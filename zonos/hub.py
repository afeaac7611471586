"""Fetching checkpoint files from the Hugging Face Hub or a local directory, with errors that say what to do."""

from __future__ import annotations

import os
from pathlib import Path


def resolve_file(
    repo_or_dir: str | os.PathLike, filename: str, revision: str | None = None, cache_dir: str | None = None
) -> str:
    """Path of ``filename`` from a local directory, or from the Hub cache (downloading if allowed).

    A repo id that cannot be fetched (offline mode, no network, nothing cached) raises ``FileNotFoundError``
    that names the file and says how to get it onto this machine.
    """
    local = Path(repo_or_dir)
    if local.is_dir():
        path = local / filename
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: the directory must hold {filename}")
        return str(path)

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError

    repo_id = str(repo_or_dir)
    try:
        return hf_hub_download(repo_id=repo_id, filename=filename, revision=revision, cache_dir=cache_dir)
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"{repo_id}/{filename} is not in the Hugging Face cache and cannot be downloaded here "
            f"(offline mode or no network). On a connected machine run "
            f"`huggingface-cli download {repo_id}` and copy the cache (HF_HOME), or pass a local directory "
            f"holding {filename} instead of the repo id."
        ) from e
    except (RepositoryNotFoundError, EntryNotFoundError) as e:
        raise FileNotFoundError(
            f"{repo_id} has no file {filename} (revision {revision or 'main'}): check the repo id"
        ) from e

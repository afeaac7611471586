"""The kernel cache (:mod:`zonos_accel.kernel_cache`): one directory reaches every compiler, as the compilers
themselves resolve it (Triton's knobs and cache manager, CuTeDSL's file-cache path), in fresh processes so that
neither the environment nor the compilers' state leak into other tests; which root wins; clear errors; and the
Docker entrypoint's layout."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from zonos.errors import ZonosInputError
from zonos_accel import kernel_cache
from zonos_accel.kernel_cache import kernel_cache_dirs, use_kernel_cache

ROOT = Path(__file__).resolve().parents[1]
COMPILER_VARS = ("ZONOS_KERNEL_CACHE", "TRITON_CACHE_DIR", "CUTE_DSL_CACHE_DIR", "XDG_CACHE_HOME")


def needs(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed here")


def python(code: str, **env: str) -> str:
    """Run ``code`` in a fresh interpreter without any kernel-cache variable but ``env``; returns its stdout."""
    clean = {k: v for k, v in os.environ.items() if k not in COMPILER_VARS}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, **env},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def fresh(monkeypatch):
    """No kernel cache chosen yet in this process, and no kernel-cache variable set (both restored after)."""
    monkeypatch.setattr(kernel_cache, "_applied", None)
    for name in COMPILER_VARS:
        monkeypatch.delenv(name, raising=False)


@needs("triton")
def test_triton_resolves_its_cache_under_the_root(tmp_path):
    # Before triton is imported, and after: a directory set in Python (knobs) outranks the variable, and is
    # replaced too.
    out = python(
        f"""
        from zonos_accel.kernel_cache import use_kernel_cache
        cache = use_kernel_cache({str(tmp_path / "a")!r})
        import triton
        from triton.runtime.cache import get_cache_manager
        print(triton.knobs.cache.dir)
        print(get_cache_manager("ab" * 16).cache_dir)
        """
    )
    knob, manager = out.split()
    assert Path(knob) == tmp_path / "a" / "triton"
    assert Path(manager).parent == tmp_path / "a" / "triton"  # where Triton writes a compiled kernel and its launcher

    out = python(
        f"""
        import triton
        triton.knobs.cache.dir = {str(tmp_path / "elsewhere")!r}
        from zonos_accel.kernel_cache import use_kernel_cache
        use_kernel_cache({str(tmp_path / "b")!r})
        from triton.runtime.cache import get_cache_manager
        print(get_cache_manager("ab" * 16).cache_dir)
        """
    )
    assert Path(out.strip()).parent == tmp_path / "b" / "triton"


@needs("cutlass")
def test_cutedsl_resolves_its_file_cache_under_the_root(tmp_path):
    # CuTeDSL's file cache loads and dumps compiled modules in cache_helpers' directory: a function of
    # CUTE_DSL_CACHE_DIR in later releases, a value fixed when cutlass is imported in 4.3.
    out = python(
        f"""
        from zonos_accel.kernel_cache import use_kernel_cache
        use_kernel_cache({str(tmp_path / "a")!r})
        import cutlass.cute
        from cutlass.base_dsl import cache_helpers as h
        resolve = getattr(h, "get_default_generated_ir_path", None)
        print(resolve("CUTE_DSL") if resolve else h.default_generated_ir_path)
        """
    )
    assert Path(out.strip()) == tmp_path / "a" / "cutedsl"

    # Imported first: a release that reads the variable at each compile follows; 4.3 refuses with the reason.
    out = python(
        f"""
        import cutlass.cute
        from cutlass.base_dsl import cache_helpers as h
        from zonos.errors import ZonosInputError
        from zonos_accel.kernel_cache import use_kernel_cache
        try:
            use_kernel_cache({str(tmp_path / "b")!r})
        except ZonosInputError as e:
            print("refused", e)
        else:
            print("resolves", h.get_default_generated_ir_path("CUTE_DSL"))
        """
    )
    word, _, rest = out.strip().partition(" ")
    if word == "resolves":
        assert Path(rest) == tmp_path / "b" / "cutedsl"
    else:
        assert "was imported before" in rest and "before anything imports cutlass" in rest


def test_which_root_wins(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "own-triton"))
    default = kernel_cache_dirs()
    assert default.root == tmp_path / "xdg" / "zonos" / "kernels"
    assert default.triton == tmp_path / "own-triton"  # the default root keeps a compiler's own variable
    assert default.cutedsl == default.root / "cutedsl"
    assert f"Triton in {tmp_path / 'own-triton'}" in default.describe()

    monkeypatch.setenv("ZONOS_KERNEL_CACHE", str(tmp_path / "env"))
    chosen = kernel_cache_dirs()
    assert (chosen.root, chosen.triton) == (tmp_path / "env", tmp_path / "env" / "triton")
    assert chosen.describe() == str(tmp_path / "env")
    assert kernel_cache_dirs(tmp_path / "arg").triton == tmp_path / "arg" / "triton"  # the argument beats both

    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("ZONOS_KERNEL_CACHE")
    assert kernel_cache_dirs().root == Path("~/.cache/zonos/kernels").expanduser()
    assert not (tmp_path / "xdg").exists() and not (tmp_path / "env").exists()  # resolving creates nothing


def test_an_unwritable_directory_names_it_and_the_fix(fresh, tmp_path, monkeypatch):
    # A CuTeDSL 4.3 that an earlier test imported would be refused first (its directory is fixed at import).
    monkeypatch.delitem(sys.modules, "cutlass.base_dsl.cache_helpers", raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ZonosInputError) as e:
        use_kernel_cache(blocker / "kernels")
    message = str(e.value)
    assert f"cannot write compiled kernels into {blocker / 'kernels' / 'triton'}" in message
    assert "ZONOS_KERNEL_CACHE=DIR" in message and "--kernel-cache DIR" in message
    assert "TRITON_CACHE_DIR" not in os.environ and kernel_cache._applied is None  # nothing was changed


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_refused(fresh, tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(ZonosInputError, match="Permission denied"):
            use_kernel_cache(tmp_path)
    finally:
        tmp_path.chmod(0o700)


def test_one_kernel_cache_per_process(tmp_path):
    out = python(
        f"""
        import os
        from zonos.errors import ZonosInputError
        from zonos_accel.kernel_cache import use_kernel_cache
        first = use_kernel_cache({str(tmp_path / "a")!r})
        # The same root again, or no root (the default yields to the earlier choice): nothing changes.
        assert use_kernel_cache({str(tmp_path / "a")!r}) == first and use_kernel_cache() == first
        print(os.environ["TRITON_CACHE_DIR"], os.environ["CUTE_DSL_CACHE_DIR"])
        try:
            use_kernel_cache({str(tmp_path / "b")!r})
        except ZonosInputError as e:
            print(e)
        """
    )
    dirs, message = out.strip().split("\n")
    assert dirs.split() == [str(tmp_path / "a" / "triton"), str(tmp_path / "a" / "cutedsl")]
    assert f"kernel cache {tmp_path / 'b'}: this process already keeps its kernels in {tmp_path / 'a'}" in message
    assert not (tmp_path / "b").exists()


def test_a_cutedsl_imported_with_a_fixed_directory_is_refused(fresh, monkeypatch, tmp_path):
    helpers = types.ModuleType("cutlass.base_dsl.cache_helpers")  # 4.3's layout: the directory is a value
    helpers.default_generated_ir_path = str(tmp_path / "tmp-cache")
    monkeypatch.setitem(sys.modules, helpers.__name__, helpers)
    with pytest.raises(ZonosInputError, match=f"keeps its kernels in {tmp_path / 'tmp-cache'}"):
        use_kernel_cache(tmp_path / "kernels")
    assert not (tmp_path / "kernels").exists()


def test_the_docker_entrypoint_uses_the_same_layout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in COMPILER_VARS}
    env.update(ZONOS_KERNEL_CACHE=str(tmp_path), ZONOS_ALLOW_CPU="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # its `python` has torch
    result = subprocess.run(
        ["sh", str(ROOT / "docker" / "entrypoint.sh"), "sh", "-c", 'echo "$TRITON_CACHE_DIR $CUTE_DSL_CACHE_DIR"'],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    cache = kernel_cache_dirs(tmp_path)
    assert result.stdout.split() == [str(cache.triton), str(cache.cutedsl)]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ZONOS_KERNEL_CACHE=/kernels" in dockerfile and 'VOLUME ["/cache", "/kernels"]' in dockerfile

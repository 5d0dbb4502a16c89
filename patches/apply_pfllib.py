#!/usr/bin/env python3
"""Add FedLAG to an existing PFLlib checkout (GitHub TsingZ0/PFLlib, with or without your changes).

    python patches/apply_pfllib.py PATH/TO/PFLlib            # install (again: changes nothing)
    python patches/apply_pfllib.py --dry-run PATH/TO/PFLlib  # print the patch, change nothing
    python patches/apply_pfllib.py --revert PATH/TO/PFLlib   # remove it; main.py byte for byte

What it does to the checkout:

* copies this repository's ``system/flcore/lag/`` (conflict maths + ``LayerConflictMixin``, torch
  only) unchanged to ``system/flcore/lag/``, and ``patches/pfllib/``'s ``lag_pfllib.py`` (flags,
  ``-algo`` hook, composition), ``serverfedlag.py`` and ``clientfedlag.py`` to ``system/flcore/``,
  ``system/flcore/servers/`` and ``system/flcore/clients/``;
* inserts one marked block of two statements into ``system/main.py``, right before the one
  ``args = parser.parse_args()`` (the only anchor): it adds the ``--lag_*`` flags and wraps
  ``run(args)`` so that ``-algo FedLAG`` and ``-algo X+LAG`` run main.py's own branch for X;
* records every file and the inserted block, with SHA-256 checksums, in
  ``system/flcore/fedlag_patch.json``, which ``--revert`` uses to remove exactly what was added.

It refuses, and changes nothing, when the folder does not look like PFLlib, when main.py has no
single ``args = parser.parse_args()`` line, no ``run(args)`` with an ``args.algorithm`` dispatch, or
when a file it would write exists with other content or is a folder. Installing and reverting are all
or nothing: every file is first staged next to its target, then swapped in; if any step fails (a
read-only folder, a full disk), what was done is undone and the checkout is left as it was, with the
same "refusing, nothing changed" line. Standard library only.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LAG_SOURCE = REPO / "system" / "flcore" / "lag"
PAYLOAD = HERE / "pfllib"

MAIN = "system/main.py"
MANIFEST = "system/flcore/fedlag_patch.json"
PAYLOAD_FILES = (  # file in patches/pfllib/ -> where it goes in the checkout
    ("lag_pfllib.py", "system/flcore/lag_pfllib.py"),
    ("serverfedlag.py", "system/flcore/servers/serverfedlag.py"),
    ("clientfedlag.py", "system/flcore/clients/clientfedlag.py"),
)
REQUIRED = (MAIN, "system/flcore/servers/serverbase.py", "system/flcore/servers/serveravg.py",
            "system/flcore/clients/clientbase.py", "system/flcore/clients/clientavg.py")

BEGIN = "# >>> FedLAG: added by patches/apply_pfllib.py (undo: apply_pfllib.py --revert) >>>"
END = "# <<< FedLAG <<<"
HOOK_MODULE = "flcore.lag_pfllib"
HOOK_FUNCTION = "install_lag"


class Refusal(Exception):
    """The installer will not touch the checkout; the message says why and what to do."""


# ----- small helpers -----------------------------------------------------------------------------------
def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def path_of(root: Path, rel: str) -> Path:
    return root.joinpath(*rel.split("/"))


def payload() -> Dict[str, bytes]:
    """Checkout-relative path -> bytes of every file the patch installs besides main.py's block."""
    sources = sorted(LAG_SOURCE.glob("*.py"))
    if not sources:
        raise Refusal(f"{LAG_SOURCE} holds no .py files; run the installer from a complete checkout of this project")
    files = {f"system/flcore/lag/{src.name}": src.read_bytes() for src in sources}
    for name, dest in PAYLOAD_FILES:
        files[dest] = (PAYLOAD / name).read_bytes()
    return files


def load_hook_module():
    """``patches/pfllib/lag_pfllib.py`` (standard library at import), for its dispatch reader."""
    spec = importlib.util.spec_from_file_location("_fedlag_lag_pfllib", PAYLOAD / "lag_pfllib.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Transaction:
    """Changes to the checkout made all or nothing.

    :meth:`write` and :meth:`remove` only plan; :meth:`commit` first stages every new content in a
    hidden temporary file next to its target (creating missing folders), which also proves each
    folder writable, then swaps the files into place by renames, moving each replaced or removed file
    aside rather than deleting it. When anything fails, every step already taken is undone in
    reverse, so the checkout is left exactly as it was (contents, modes and times), and
    :class:`Refusal` says what could not be written.
    """

    def __init__(self, root: Path):
        self.root = root
        self.planned: List[Tuple[str, Optional[bytes], Optional[Path]]] = []  # (rel, data or None, mode_from)

    def write(self, rel: str, data: bytes, mode_from: Optional[Path] = None) -> None:
        self.planned.append((rel, data, mode_from))

    def remove(self, rel: str) -> None:
        self.planned.append((rel, None, None))

    def commit(self) -> None:
        made_dirs: List[Path] = []  # created here, in creation order
        staged: Dict[str, str] = {}  # rel -> temporary file holding its new content
        swapped: List[Tuple[Path, Optional[str]]] = []  # (target, where its old file was moved, or None)
        current = ""
        try:
            for rel, data, mode_from in self.planned:
                current = rel
                if data is not None:
                    dest = path_of(self.root, rel)
                    make_dirs(dest.parent, made_dirs)
                    staged[rel] = stage(dest, data, mode_from)
            for rel, data, _ in self.planned:
                current = rel
                dest = path_of(self.root, rel)
                aside = None
                if dest.exists():
                    aside = _temp_name(dest, "old")
                    try:
                        os.replace(dest, aside)
                    except OSError:
                        os.unlink(aside)
                        raise
                swapped.append((dest, aside))
                if data is not None:
                    os.replace(staged[rel], dest)
                    del staged[rel]
        except OSError as err:
            undo_errors = _undo(swapped, staged, made_dirs)
            reason = err.strerror or str(err)
            if undo_errors:
                raise PartialChange(f"writing {current} failed ({reason}), and undoing the steps before it failed "
                                    f"too ({'; '.join(undo_errors)}); check those paths by hand") from None
            raise Refusal(f"cannot write {current} ({reason}); is the checkout read-only, or is a path of "
                          "it on a full disk? Fix that and run again") from None
        for _, aside in swapped:  # done: the old files are no longer needed
            if aside is not None:
                try:
                    os.unlink(aside)
                except OSError:
                    print(f"note: could not delete the temporary file {aside}; delete it by hand")


class PartialChange(Exception):
    """A write failed and the undo did not complete: the message lists what to check."""


def _temp_name(dest: Path, kind: str) -> str:
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.fedlag-{kind}-", dir=dest.parent)
    os.close(fd)
    return name


def make_dirs(folder: Path, made: List[Path]) -> None:
    """Create ``folder`` and its missing parents, appending each to ``made`` as soon as it exists (so
    that an undo after a failure part-way removes exactly those)."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir()
        made.append(path)


def stage(dest: Path, data: bytes, mode_from: Optional[Path] = None) -> str:
    """``data`` in a new hidden file next to ``dest``, with ``mode_from``'s permissions (else 0644)."""
    name = _temp_name(dest, "new")
    try:
        with open(name, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode_from is not None and mode_from.exists():
            shutil.copymode(mode_from, name)
        else:
            os.chmod(name, 0o644)
    except BaseException:
        os.unlink(name)
        raise
    return name


def _undo(swapped, staged, made_dirs) -> List[str]:
    """Put every swapped file back, delete staged files and created folders; returns what failed."""
    errors = []
    for dest, aside in reversed(swapped):
        try:
            if aside is not None:
                os.replace(aside, dest)
            elif dest.exists():
                os.unlink(dest)
        except OSError as err:
            errors.append(f"{dest}: {err.strerror or err}")
    for name in staged.values():
        try:
            os.unlink(name)
        except OSError as err:
            errors.append(f"{name}: {err.strerror or err}")
    for folder in reversed(made_dirs):
        try:
            folder.rmdir()
        except OSError as err:
            errors.append(f"{folder}: {err.strerror or err}")
    return errors


def print_diff(rel: str, old: Optional[bytes], new: Optional[bytes]) -> None:
    a = [] if old is None else old.decode("utf-8", "replace").splitlines(keepends=True)
    b = [] if new is None else new.decode("utf-8", "replace").splitlines(keepends=True)
    diff = difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{rel}",
                                "/dev/null" if new is None else f"b/{rel}")
    for line in diff:
        sys.stdout.write(line if line.endswith(("\n", "\r")) else line + "\n")


# ----- checks ------------------------------------------------------------------------------------------
def check_pfllib(root: Path) -> None:
    if not root.is_dir():
        raise Refusal(f"{root} is not a folder")
    missing = [rel for rel in REQUIRED if not path_of(root, rel).is_file()]
    if missing:
        hint = ""
        if (root / "main.py").is_file() and (root / "flcore").is_dir():
            hint = f" It looks like PFLlib's system/ folder: pass its parent, {root.parent}."
        raise Refusal(f"{root} does not look like a PFLlib checkout (missing: {', '.join(missing)}).{hint}")


def check_targets(root: Path, rels) -> None:
    """Refuse a path the patch writes that is a folder (or anything but a file), or that lies under a
    file: the install would stop half-way there."""
    for rel in rels:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            folder = path_of(root, "/".join(parts[:i]))
            if folder.exists() and not folder.is_dir():
                raise Refusal(f"{'/'.join(parts[:i])} is a file where the patch needs a folder (for {rel}); "
                              "move it away and run again")
        dest = path_of(root, rel)
        if (dest.exists() or dest.is_symlink()) and not dest.is_file():
            raise Refusal(f"{rel} is {'a folder' if dest.is_dir() else 'not a regular file'} where the patch "
                          "installs a file; move it away and run again")


def read_main(root: Path) -> Tuple[bytes, str, List[bytes]]:
    data = path_of(root, MAIN).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Refusal(f"{MAIN} is not UTF-8 text; the installer will not edit it") from None
    try:
        ast.parse(text)
    except SyntaxError as err:
        raise Refusal(f"{MAIN} does not parse ({err}); fix it before installing") from None
    return data, text, data.splitlines(keepends=True)


def _parse_args_assigns(tree: ast.AST) -> List[ast.Assign]:
    return [n for n in ast.walk(tree)
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
            and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute)
            and n.value.func.attr == "parse_args" and isinstance(n.value.func.value, ast.Name)]


def find_anchor(text: str, lines: List[bytes]) -> Tuple[int, bytes, str]:
    """(0-based line of ``args = parser.parse_args()``, its indentation, the parser's name)."""
    tree = ast.parse(text)
    hits = _parse_args_assigns(tree)
    if not hits:
        raise Refusal(f"{MAIN} has no `args = parser.parse_args()` line, the anchor the FedLAG block goes "
                      "before. Add the FedLAG flags and hook by hand (see patches/README.md) or restore "
                      "that line")
    if len(hits) > 1:
        where = ", ".join(str(n.lineno) for n in hits)
        raise Refusal(f"{MAIN} calls parse_args() {len(hits)} times (lines {where}); the installer cannot tell "
                      "which parser is the command line. Keep one, or add the block by hand (patches/README.md)")
    node = hits[0]
    parser = node.value.func.value.id
    made = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and any(isinstance(t, ast.Name) and t.id == parser for t in n.targets)
            and (getattr(n.value.func, "attr", None) or getattr(n.value.func, "id", "")) == "ArgumentParser"]
    if not made:
        raise Refusal(f"{MAIN} line {node.lineno}: `{parser}` is not created by argparse.ArgumentParser() "
                      "in main.py, so the installer cannot add the FedLAG flags to it")
    index = node.lineno - 1
    indent = lines[index][:node.col_offset]
    if indent.strip(b" \t"):
        raise Refusal(f"{MAIN} line {node.lineno}: parse_args() shares its line with other code")
    if index > 0 and lines[index - 1].rstrip(b"\r\n").endswith(b"\\"):
        raise Refusal(f"{MAIN} line {node.lineno}: the line before parse_args() continues with a backslash")
    return index, indent, parser


def check_dispatch(text: str) -> List[str]:
    """Refuse when ``run(args)`` cannot be hooked; returns warnings."""
    hook = load_hook_module()
    try:
        dispatch = hook.find_dispatch(text)
    except hook.DispatchError as err:
        raise Refusal(f"{err}; -algo X+LAG needs it (see patches/README.md)") from None
    warnings = []
    if hook.FEDLAG_BASE not in dispatch:
        warnings.append(f"{MAIN}: run() has no `args.algorithm == \"FedAvg\"` branch, so -algo FedLAG is "
                        "unavailable (X+LAG works for the algorithms it has)")
    own = sorted(n for n in dispatch if hook.base_algorithm(n) is not None)
    if own:
        warnings.append(f"{MAIN} already has branches for {', '.join(own)}; those names keep running your "
                        "code, the patch handles the other LAG names")
    return warnings


def newline_of(line: bytes) -> bytes:
    for ending in (b"\r\n", b"\n", b"\r"):
        if line.endswith(ending):
            return ending
    return b"\n"


def make_block(indent: bytes, parser: str, newline: bytes) -> bytes:
    body = (BEGIN,
            f"from {HOOK_MODULE} import {HOOK_FUNCTION}  # --lag_* flags, -algo FedLAG, -algo X+LAG",
            f"{HOOK_FUNCTION}({parser}, globals())",
            END)
    return b"".join(indent + line.encode("ascii") + newline for line in body)


def find_block(lines: List[bytes]) -> Optional[Tuple[int, int]]:
    """[start, end) of the marked block in main.py's lines, or None; refuses on broken markers."""
    begins = [i for i, line in enumerate(lines) if line.strip().startswith(BEGIN[:12].encode())]
    ends = [i for i, line in enumerate(lines) if line.strip() == END.encode()]
    if not begins and not ends:
        return None
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise Refusal(f"{MAIN} has {len(begins)} FedLAG begin and {len(ends)} end markers; fix them by hand "
                      f"(one `{BEGIN}` line, then one `{END}` line)")
    return begins[0], ends[0] + 1


def verify_hooked(text: str) -> None:
    """After insertion: the import and the call are the statements just before parse_args()."""
    tree = ast.parse(text)
    anchor = _parse_args_assigns(tree)
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for a, b, c in zip(body, body[1:], body[2:]):
                if (isinstance(a, ast.ImportFrom) and a.module == HOOK_MODULE and isinstance(b, ast.Expr)
                        and isinstance(b.value, ast.Call) and getattr(b.value.func, "id", "") == HOOK_FUNCTION
                        and c in anchor):
                    return
    raise Refusal(f"the FedLAG block would not land right before parse_args() in {MAIN}; add it by hand "
                  "(patches/README.md)")


def read_manifest(root: Path) -> Optional[dict]:
    path = path_of(root, MANIFEST)
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        assert manifest.get("format") == 1 and isinstance(manifest.get("files"), dict)
        return manifest
    except (ValueError, AssertionError):
        raise Refusal(f"{MANIFEST} is not a manifest this installer wrote; move it away and retry") from None


# ----- apply -------------------------------------------------------------------------------------------
def apply(root: Path, dry_run: bool) -> int:
    check_pfllib(root)
    files = payload()
    check_targets(root, [*files, MANIFEST])
    manifest = read_manifest(root)
    if manifest is not None:
        check_targets(root, manifest["files"])
    main_old, text, lines = read_main(root)
    span = find_block(lines)
    if span is not None and manifest is None:
        raise Refusal(f"{MAIN} already has a FedLAG block but {MANIFEST} is missing; delete the lines from "
                      f"`{BEGIN}` to `{END}` by hand, then install again")
    if span is None and manifest is not None:
        raise Refusal(f"{MANIFEST} says FedLAG is installed but {MAIN} has no FedLAG block (removed by hand?); "
                      "run with --revert first, then install again")
    warnings = check_dispatch(text)

    # main.py: insert the block, or check / refresh the one there.
    if span is None:
        index, indent, parser = find_anchor(text, lines)
        block = make_block(indent, parser, newline_of(lines[index]))
        main_new = b"".join(lines[:index]) + block + b"".join(lines[index:])
        verify_hooked(main_new.decode("utf-8"))
        before = sha256(main_old)
    else:
        start, end = span
        current = b"".join(lines[start:end])
        rest = lines[:start] + lines[end:]
        index, indent, parser = find_anchor(b"".join(rest).decode("utf-8"), rest)
        if index != start:
            raise Refusal(f"the FedLAG block in {MAIN} is no longer right before parse_args(); run --revert, "
                          "then install again")
        block = make_block(indent, parser, newline_of(lines[end - 1]))
        if current != block and current != manifest["main"]["block"].encode("utf-8"):
            raise Refusal(f"the FedLAG block in {MAIN} was edited by hand; restore it or run --revert --force")
        main_new = b"".join(lines[:start]) + block + b"".join(lines[end:])
        before = manifest["main"]["sha256_before"]

    # Installed files: create, refresh (if untouched since the last install) or adopt identical ones.
    recorded = manifest["files"] if manifest else {}
    adopted = set(manifest.get("adopted", [])) if manifest else set()
    actions: List[Tuple[str, str]] = []  # (rel, "create" | "update" | "same" | "adopt" | "remove")
    problems = []
    for rel, data in files.items():
        dest = path_of(root, rel)
        if not dest.exists():
            actions.append((rel, "create"))
        elif dest.read_bytes() == data:
            actions.append((rel, "same" if rel in recorded else "adopt"))
        elif rel in recorded and sha256(dest.read_bytes()) == recorded[rel]:
            actions.append((rel, "update"))
        else:
            problems.append(rel)
    for rel in sorted(set(recorded) - set(files)):  # a file an older version installed
        dest = path_of(root, rel)
        if dest.exists() and rel not in adopted and sha256(dest.read_bytes()) == recorded[rel]:
            actions.append((rel, "remove"))
    if problems:
        raise Refusal("these files exist with other content; move them away (or run --revert if an older "
                      "FedLAG patch put them there): " + ", ".join(problems))

    new_manifest = {
        "format": 1,
        "tool": "patches/apply_pfllib.py",
        "files": {rel: sha256(data) for rel, data in files.items()},
        "adopted": sorted((adopted & set(files)) | {rel for rel, act in actions if act == "adopt"}),
        "dirs": sorted(set(manifest.get("dirs", []) if manifest else [])
                       | {d for rel, act in actions if act == "create" for d in missing_dirs(root, rel)}),
        "main": {"path": MAIN, "block": block.decode("utf-8"), "sha256_before": before,
                 "sha256_after": sha256(main_new)},
    }
    manifest_bytes = (json.dumps(new_manifest, indent=1, sort_keys=True) + "\n").encode("utf-8")
    changing = [(rel, act) for rel, act in actions if act in ("create", "update", "remove")]
    manifest_path = path_of(root, MANIFEST)
    manifest_same = manifest_path.exists() and manifest_path.read_bytes() == manifest_bytes
    for message in warnings:
        print(f"warning: {message}")
    if main_new == main_old and not changing and manifest_same:
        print(f"FedLAG is already installed in {root}; nothing to change.")
        return 0

    if dry_run:
        print(f"# dry run: the patch apply_pfllib.py would make to {root} (nothing written)")
        print_diff(MAIN, main_old, main_new)
        for rel, act in changing:
            old = path_of(root, rel).read_bytes() if act != "create" else None
            print_diff(rel, old, None if act == "remove" else files[rel])
        print(f"# and {'update' if manifest else 'create'} {MANIFEST} (checksums, for --revert)")
        return 0

    change = Transaction(root)
    for rel, act in changing:
        if act == "remove":
            change.remove(rel)
        else:
            change.write(rel, files[rel])
    if main_new != main_old:
        change.write(MAIN, main_new, mode_from=path_of(root, MAIN))
    change.write(MANIFEST, manifest_bytes)
    change.commit()
    for rel, act in actions:
        if act != "same":
            print(f"{act:>7}  {rel}")
    print(f"{'updated' if main_new != main_old else '   same'}  {MAIN} (FedLAG block before line {index + 1})")
    print(f"FedLAG installed in {root}. From {root / 'system'}: python main.py -algo FedLAG ... "
          f"or -algo FedRep+LAG ...; undo with: python {Path(__file__).name} --revert {root}")
    return 0


def missing_dirs(root: Path, rel: str) -> List[str]:
    """Folders above ``rel`` that do not exist yet (so --revert removes them again)."""
    out = []
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        if not path_of(root, "/".join(parts[:i])).exists():
            out.append("/".join(parts[:i]))
    return out


# ----- revert ------------------------------------------------------------------------------------------
def revert(root: Path, dry_run: bool, force: bool) -> int:
    if not path_of(root, MAIN).is_file():
        raise Refusal(f"{root} has no {MAIN}; pass the PFLlib checkout the patch was applied to")
    check_targets(root, [MANIFEST])
    manifest = read_manifest(root)
    if manifest is not None:
        check_targets(root, manifest["files"])
    main_old, _, lines = read_main(root)
    span = find_block(lines)
    if manifest is None:
        if span is not None:
            raise Refusal(f"{MAIN} has a FedLAG block but {MANIFEST} is missing; delete the lines from "
                          f"`{BEGIN}` to `{END}` by hand")
        print(f"FedLAG is not installed in {root}; nothing to revert.")
        return 0

    main_new = main_old
    notes = []
    if span is None:
        notes.append(f"{MAIN} has no FedLAG block any more; left as it is")
    else:
        start, end = span
        if b"".join(lines[start:end]) != manifest["main"]["block"].encode("utf-8") and not force:
            raise Refusal(f"the FedLAG block in {MAIN} was edited since it was installed; check it, then "
                          "run again with --force to remove the marked lines anyway")
        main_new = b"".join(lines[:start] + lines[end:])

    adopted = set(manifest.get("adopted", []))
    remove, edited = [], []
    for rel, digest in sorted(manifest["files"].items()):
        dest = path_of(root, rel)
        if rel in adopted or not dest.exists():
            continue
        (remove if force or sha256(dest.read_bytes()) == digest else edited).append(rel)
    if edited:
        raise Refusal("these installed files were edited since; back them up and run again with --force: "
                      + ", ".join(edited))

    if dry_run:
        print(f"# dry run: what --revert would do to {root} (nothing written)")
        print_diff(MAIN, main_old, main_new)
        for rel in remove:
            print_diff(rel, path_of(root, rel).read_bytes(), None)
        print(f"# and delete {MANIFEST}")
        return 0

    change = Transaction(root)
    if main_new != main_old:
        change.write(MAIN, main_new, mode_from=path_of(root, MAIN))
    for rel in remove:
        change.remove(rel)
    change.remove(MANIFEST)
    change.commit()
    # The checkout is now as before the install; what follows only tidies up (bytecode of the removed
    # modules, folders the install created), and a failure there is reported, not fatal.
    for rel in remove:
        dest = path_of(root, rel)
        print(f"removed  {rel}")
        cache = dest.parent / "__pycache__"
        try:
            if cache.is_dir():
                for compiled in cache.glob(f"{dest.stem}.*.pyc"):
                    compiled.unlink()
                if not any(cache.iterdir()):
                    cache.rmdir()
        except OSError as err:
            notes.append(f"could not delete compiled files in {cache} ({err.strerror or err})")
    for rel in sorted(manifest.get("dirs", []), key=lambda d: d.count("/"), reverse=True):
        folder = path_of(root, rel)
        if folder.is_dir() and not any(folder.iterdir()):
            try:
                folder.rmdir()
                print(f"removed  {rel}/")
            except OSError as err:
                notes.append(f"{rel}/ kept: {err.strerror or err}")
        elif folder.is_dir():
            notes.append(f"{rel}/ kept: it holds files the patch did not install")
    for note in notes:
        print(f"note: {note}")
    if sha256(main_new) == manifest["main"]["sha256_before"]:
        print(f"restored {MAIN} byte for byte")
    elif span is not None:
        print(f"removed the FedLAG block from {MAIN}; your other edits since the install are kept")
    print(f"FedLAG removed from {root}.")
    return 0


# ----- command line ------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="apply_pfllib.py",
        description="Add FedLAG (-algo FedLAG, -algo X+LAG) to an existing PFLlib checkout, or remove it.")
    parser.add_argument("target", type=Path, help="root of the PFLlib checkout (the folder holding system/)")
    parser.add_argument("--dry-run", action="store_true", help="print the patch and change nothing")
    parser.add_argument("--revert", action="store_true", help="remove what the installer added")
    parser.add_argument("--force", action="store_true",
                        help="with --revert: remove installed files and the marked block even if edited")
    args = parser.parse_args(argv)
    root = args.target.expanduser().resolve()
    try:
        if args.revert:
            return revert(root, args.dry_run, args.force)
        if args.force:
            parser.error("--force only goes with --revert")
        return apply(root, args.dry_run)
    except Refusal as refusal:
        print(f"apply_pfllib.py: refusing, nothing changed: {refusal}", file=sys.stderr)
        return 2
    except PartialChange as problem:
        print(f"apply_pfllib.py: failed, and the checkout is partly changed: {problem}", file=sys.stderr)
        return 1
    except OSError as err:  # reading the checkout (every write goes through Transaction, which refuses)
        where = f"{err.filename}: " if err.filename else ""
        print(f"apply_pfllib.py: refusing, nothing changed: cannot read {where}{err.strerror or err}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. --dry-run | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)

#!/usr/bin/env python3
"""Add FedLAG to an existing PFLlib checkout (GitHub TsingZ0/PFLlib, with or without your changes).

    python patches/apply_pfllib.py PATH/TO/PFLlib            # install (again: changes nothing)
    python patches/apply_pfllib.py --dry-run PATH/TO/PFLlib  # print the patch, change nothing
    python patches/apply_pfllib.py --revert PATH/TO/PFLlib   # remove it; main.py byte for byte

Copies ``system/flcore/lag/`` and ``system/utils/flagfields.py`` (which ``lag/settings.py`` imports)
unchanged and ``patches/pfllib/``'s three files into the checkout, inserts one marked block right before
main.py's ``args = parser.parse_args()``, and records the installed files' SHA-256 in
``system/flcore/fedlag_patch.json`` for ``--revert``. Refuses, changing nothing, what it
cannot do safely (see patches/README.md); writes all or nothing. Standard library only.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
LAG_SOURCE = HERE.parent / "system" / "flcore" / "lag"
# The flag machinery lag/settings.py imports as ``utils.flagfields``: the same path in this repository and in
# the checkout, whose main.py already imports from its system/utils/.
FLAG_FIELDS = "system/utils/flagfields.py"
PAYLOAD = {  # file in patches/pfllib/ -> where it goes in the checkout
    "lag_pfllib.py": "system/flcore/lag_pfllib.py",
    "serverfedlag.py": "system/flcore/servers/serverfedlag.py",
    "clientfedlag.py": "system/flcore/clients/clientfedlag.py",
}
MAIN = "system/main.py"
MANIFEST = "system/flcore/fedlag_patch.json"
REQUIRED = (MAIN, "system/flcore/servers/serverbase.py", "system/flcore/servers/serveravg.py",
            "system/flcore/clients/clientbase.py", "system/flcore/clients/clientavg.py")
BEGIN = "# >>> FedLAG: added by patches/apply_pfllib.py (undo: apply_pfllib.py --revert) >>>"
END = "# <<< FedLAG <<<"
ANCHOR = re.compile(r"([ \t]*)args = (\w+)\.parse_args\(\)[ \t]*(#.*)?")

_spec = importlib.util.spec_from_file_location("lag_pfllib", HERE / "pfllib" / "lag_pfllib.py")
hook = importlib.util.module_from_spec(_spec)  # the runtime hook; standard library at import
_spec.loader.exec_module(hook)

Changes = Dict[str, Optional[bytes]]  # checkout path -> new content, or None to remove it


class Refusal(Exception):
    """Nothing was changed; the message says why and what to do."""


class PartialChange(Exception):
    """A write failed and undoing the steps before it failed too; the message lists what to check."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def path_of(root: Path, rel: str) -> Path:
    return root.joinpath(*rel.split("/"))


def read(root: Path, rel: str) -> Optional[bytes]:
    """A checkout file's bytes, None if there is none (a path under a file included: writing it refuses)."""
    path = path_of(root, rel)
    if not path.exists():
        return None
    try:
        return path.read_bytes()
    except OSError as err:
        raise Refusal(f"cannot read {rel} ({err.strerror or err}); move it away and run again") from None


def payload() -> Dict[str, bytes]:
    """Checkout path -> bytes of every file the patch installs (main.py's block aside)."""
    files = {f"system/flcore/lag/{src.name}": src.read_bytes() for src in sorted(LAG_SOURCE.glob("*.py"))}
    if not files:
        raise Refusal(f"{LAG_SOURCE} holds no .py files; run the installer from a complete checkout")
    files[FLAG_FIELDS] = path_of(HERE.parent, FLAG_FIELDS).read_bytes()
    files.update({dest: (HERE / "pfllib" / name).read_bytes() for name, dest in PAYLOAD.items()})
    return files


def commit(root: Path, changes: Changes) -> None:
    """Make every change or none. New contents go to hidden files next to their targets (missing folders
    are made); then, in a second pass, renames put them in place, each old file renamed aside until the
    end. A failure undoes every step taken, in reverse: contents, modes and times are as before."""
    undo, asides, rel = [], [], ""
    try:
        staged = {}
        for rel, data in changes.items():
            if data is None:
                continue
            dest = path_of(root, rel)
            for folder in reversed([folder for folder in dest.parents if not folder.exists()]):
                folder.mkdir()
                undo.append(folder.rmdir)
            staged[rel] = temp = dest.with_name(f".{dest.name}.fedlag-new")
            undo.append(lambda temp=temp: temp.exists() and temp.unlink())  # also a half-written one
            temp.write_bytes(data)
            if dest.exists():
                shutil.copymode(dest, temp)
        for rel, data in changes.items():
            dest = path_of(root, rel)
            if dest.exists():
                aside = dest.with_name(f".{dest.name}.fedlag-old")
                os.replace(dest, aside)
                asides.append(aside)
                undo.append(lambda dest=dest, aside=aside: os.replace(aside, dest))
            if data is not None:
                os.replace(staged[rel], dest)
                undo.append(lambda dest=dest, temp=staged[rel]: os.replace(dest, temp))
    except OSError as err:
        failed = []
        for step in reversed(undo):
            try:
                step()
            except OSError as undo_err:
                failed.append(str(undo_err))
        if failed:
            raise PartialChange(f"writing {rel} failed ({err.strerror or err}), and so did undoing: "
                                + "; ".join(failed)) from None
        raise Refusal(f"cannot write {rel} ({err.strerror or err}); fix that and run again") from None
    for aside in asides:
        aside.unlink()


def print_diff(rel: str, old: Optional[bytes], new: Optional[bytes]) -> None:
    a, b = ([] if d is None else d.decode("utf-8", "replace").splitlines(keepends=True) for d in (old, new))
    for line in difflib.unified_diff(a, b, "/dev/null" if old is None else f"a/{rel}",
                                     "/dev/null" if new is None else f"b/{rel}"):
        sys.stdout.write(line if line.endswith(("\n", "\r")) else line + "\n")


# ----- main.py ------------------------------------------------------------------------------------------
def read_main(root: Path) -> Tuple[str, List[str], Optional[Tuple[int, int]]]:
    """main.py's text, its lines, and [start, end) of the marked block in them (None if there is none)."""
    try:
        text = read(root, MAIN).decode("utf-8")
    except UnicodeDecodeError:
        raise Refusal(f"{MAIN} is not UTF-8 text; the installer will not edit it") from None
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if (begins or ends) and (len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]):
        raise Refusal(f"{MAIN} has {len(begins)} FedLAG begin and {len(ends)} end markers; fix them by hand "
                      f"(one `{BEGIN}` line, then one `{END}` line)")
    return text, lines, (begins[0], ends[0] + 1) if begins else None


def place_block(lines: List[str]) -> Tuple[int, str]:
    """(index of the one ``args = parser.parse_args()`` line, the block to insert before it)."""
    calls = [i for i, line in enumerate(lines) if "parse_args(" in line.split("#")[0]]
    if len(calls) > 1:
        raise Refusal(f"{MAIN} calls parse_args() {len(calls)} times (lines {', '.join(str(i + 1) for i in calls)}); "
                      "the installer cannot tell which parser is the command line. Keep one, or add the block "
                      "by hand (patches/README.md)")
    match = ANCHOR.fullmatch(lines[calls[0]].rstrip("\r\n")) if calls else None
    if match is None:
        raise Refusal(f"{MAIN} has no `args = parser.parse_args()` line, the anchor the FedLAG block goes "
                      "before. Add the block by hand (see patches/README.md) or restore that line")
    index = calls[0]
    newline = lines[index][len(lines[index].rstrip("\r\n")):] or "\n"
    body = (BEGIN, "from flcore.lag_pfllib import install_lag  # --lag_* flags, -algo FedLAG, -algo X+LAG",
            f"install_lag({match[2]}, globals())", END)
    return index, "".join(match[1] + line + newline for line in body)


def check_dispatch(text: str) -> None:
    """Refuse a main.py whose ``run(args)`` cannot be hooked; warn when FedLAG itself is unavailable."""
    if not re.search(r"^def run\(", text, re.M):
        raise Refusal(f"{MAIN} has no module-level function run(args); -algo X+LAG needs it")
    branches = hook.dispatch(text)
    if not branches:
        raise Refusal(f"{MAIN} has no `if args.algorithm == \"...\":` branch that builds `server = SomeServer("
                      "args, i)`; -algo X+LAG needs one (see patches/README.md)")
    if hook.FEDLAG_BASE not in branches:
        print(f"warning: {MAIN} has no `args.algorithm == \"FedAvg\"` branch, so -algo FedLAG is unavailable "
              "(X+LAG works for the algorithms it has)")


def read_manifest(root: Path) -> Optional[dict]:
    data = read(root, MANIFEST)
    if data is None:
        return None
    try:
        manifest = json.loads(data)
        if manifest.get("format") == 1:  # written by an earlier version of this installer
            kept = manifest.get("adopted", [])  # files that were there before: not ours to remove
            manifest = {"block": manifest["main"]["block"], "folders": manifest["dirs"],
                        "files": {rel: h for rel, h in manifest["files"].items() if rel not in kept},
                        "main_py_before": manifest["main"]["sha256_before"]}
        assert {"block", "files", "folders", "main_py_before"} <= set(manifest)
        return manifest
    except (ValueError, AssertionError, TypeError, KeyError, AttributeError):  # not JSON, or not ours
        raise Refusal(f"{MANIFEST} is not a manifest this installer wrote; move it away and run again") from None


# ----- install / revert ---------------------------------------------------------------------------------
def install(root: Path, dry_run: bool) -> int:
    if not root.is_dir():
        raise Refusal(f"{root} is not a folder")
    missing = [rel for rel in REQUIRED if not path_of(root, rel).is_file()]
    if missing:
        hint = ""
        if (root / "main.py").is_file() and (root / "flcore").is_dir():
            hint = f" It looks like PFLlib's system/ folder: pass its parent, {root.parent}."
        raise Refusal(f"{root} does not look like a PFLlib checkout (missing: {', '.join(missing)}).{hint}")
    manifest = read_manifest(root)
    text, lines, span = read_main(root)
    check_dispatch(text)
    if span and manifest is None:
        raise Refusal(f"{MAIN} already has a FedLAG block but {MANIFEST} is missing; delete the lines from "
                      f"`{BEGIN}` to `{END}` by hand, then install again")
    if manifest and not span:
        raise Refusal(f"{MANIFEST} says FedLAG is installed but {MAIN} has no FedLAG block (removed by hand?); "
                      "run with --revert first, then install again")
    if span:
        if "".join(lines[span[0]:span[1]]) != manifest["block"]:
            raise Refusal(f"the FedLAG block in {MAIN} was edited by hand; restore it or run --revert --force")
        lines = lines[:span[0]] + lines[span[1]:]
    index, block = place_block(lines)
    main_new = "".join(lines[:index]) + block + "".join(lines[index:])
    try:
        compile(main_new, MAIN, "exec")
    except (SyntaxError, ValueError) as err:
        raise Refusal(f"{MAIN} does not compile with the FedLAG block in it ({err}); fix that, or add the "
                      "block by hand (patches/README.md)") from None

    # Installed files: create, or refresh one the last install wrote (unless it was edited since).
    files = payload()
    recorded = manifest["files"] if manifest else {}
    changes: Changes = {}
    actions: Dict[str, str] = {}
    conflicts = []
    for rel, data in files.items():
        old = read(root, rel)
        if old != data and (old is None or sha256(old) == recorded.get(rel)):
            changes[rel], actions[rel] = data, "create" if old is None else "update"
        elif old is not None and rel not in recorded:
            conflicts.append(f"{rel} (not installed by this patch)")
        elif old != data:
            conflicts.append(f"{rel} (edited since the install)")
    if conflicts:
        raise Refusal("these files exist and would be overwritten; move them away (or run --revert if an "
                      "older FedLAG patch put them there): " + ", ".join(conflicts))
    for rel in sorted(set(recorded) - set(files)):  # a file an older version installed
        old = read(root, rel)
        if old is not None and sha256(old) == recorded[rel]:
            changes[rel], actions[rel] = None, "remove"
    folders = set(manifest["folders"] if manifest else []) | {  # made by this install, for --revert
        folder.relative_to(root).as_posix() for rel in changes for folder in path_of(root, rel).parents
        if not folder.exists()}

    main_bytes = main_new.encode("utf-8")
    new_manifest = {"block": block, "files": {rel: sha256(data) for rel, data in files.items()},
                    "folders": sorted(folders),
                    "main_py_before": manifest["main_py_before"] if manifest else sha256(text.encode("utf-8"))}
    manifest_bytes = (json.dumps(new_manifest, indent=1, sort_keys=True) + "\n").encode("utf-8")
    if main_new != text:
        changes[MAIN] = main_bytes
    if read(root, MANIFEST) != manifest_bytes:
        changes[MANIFEST] = manifest_bytes
    if not changes:
        print(f"FedLAG is already installed in {root}; nothing to change.")
        return 0
    if dry_run:
        print(f"# dry run: the patch apply_pfllib.py would make to {root} (nothing written)")
        for rel, data in changes.items():
            if rel != MANIFEST:
                print_diff(rel, text.encode("utf-8") if rel == MAIN else read(root, rel), data)
        print(f"# and write {MANIFEST} (checksums, for --revert)")
        return 0
    commit(root, changes)
    for rel, act in actions.items():
        print(f"{act:>7}  {rel}")
    print(f"{'updated' if MAIN in changes else '   same'}  {MAIN} (FedLAG block before line {index + 1})")
    print(f"FedLAG installed in {root}. From {root / 'system'}: python main.py -algo FedLAG ... "
          f"or -algo FedRep+LAG ...; undo with: python {Path(__file__).name} --revert {root}")
    return 0


def revert(root: Path, dry_run: bool, force: bool) -> int:
    if not path_of(root, MAIN).is_file():
        raise Refusal(f"{root} has no {MAIN}; pass the PFLlib checkout the patch was applied to")
    manifest = read_manifest(root)
    text, lines, span = read_main(root)
    if manifest is None:
        if span:
            raise Refusal(f"{MAIN} has a FedLAG block but {MANIFEST} is missing; delete the lines from "
                          f"`{BEGIN}` to `{END}` by hand")
        print(f"FedLAG is not installed in {root}; nothing to revert.")
        return 0
    changes: Changes = {}
    if span is None:
        print(f"note: {MAIN} has no FedLAG block any more; left as it is")
    else:
        if "".join(lines[span[0]:span[1]]) != manifest["block"] and not force:
            raise Refusal(f"the FedLAG block in {MAIN} was edited since it was installed; check it, then "
                          "run again with --force to remove the marked lines anyway")
        changes[MAIN] = "".join(lines[:span[0]] + lines[span[1]:]).encode("utf-8")
    edited = []
    for rel, digest in sorted(manifest["files"].items()):
        old = read(root, rel)
        if old is not None and (force or sha256(old) == digest):
            changes[rel] = None
        elif old is not None:
            edited.append(rel)
    if edited:
        raise Refusal("these installed files were edited since; back them up and run again with --force: "
                      + ", ".join(edited))
    changes[MANIFEST] = None
    if dry_run:
        print(f"# dry run: what --revert would do to {root} (nothing written)")
        for rel, data in changes.items():
            print_diff(rel, text.encode("utf-8") if rel == MAIN else read(root, rel), data)
        return 0
    commit(root, changes)
    # Done; what follows only tidies up (bytecode of the removed modules, folders the install made).
    removed = [rel for rel, data in changes.items() if data is None and rel != MANIFEST]
    try:
        for rel in removed:
            cache = path_of(root, rel).parent / "__pycache__"
            for compiled in cache.glob(f"{path_of(root, rel).stem}.*.pyc"):
                compiled.unlink()
            if cache.is_dir() and not any(cache.iterdir()):
                cache.rmdir()
        for rel in sorted(manifest["folders"], reverse=True):  # deepest first
            if path_of(root, rel).is_dir() and not any(path_of(root, rel).iterdir()):
                path_of(root, rel).rmdir()
    except OSError as err:
        print(f"note: could not tidy up {err.filename} ({err.strerror or err}); delete it by hand")
    for rel in removed:
        print(f"removed  {rel}")
    if MAIN in changes and sha256(changes[MAIN]) == manifest["main_py_before"]:
        print(f"restored {MAIN} byte for byte")
    elif MAIN in changes:
        print(f"removed the FedLAG block from {MAIN}; your other edits since the install are kept")
    print(f"FedLAG removed from {root}.")
    return 0


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
    if args.force and not args.revert:
        parser.error("--force only goes with --revert")
    root = args.target.expanduser().resolve()
    try:
        return revert(root, args.dry_run, args.force) if args.revert else install(root, args.dry_run)
    except Refusal as refusal:
        print(f"apply_pfllib.py: refusing, nothing changed: {refusal}", file=sys.stderr)
        return 2
    except PartialChange as problem:
        print(f"apply_pfllib.py: failed, and the checkout is partly changed: {problem}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # --dry-run | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

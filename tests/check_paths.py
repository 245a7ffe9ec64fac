#!/usr/bin/env python3
"""Every repository path named in a comment or a README exists.

Scans tracked files: Markdown in full; C++/CUDA/proto `//` comments; shell, Python, Bazel and
YAML `#` comments. A "path" is a token starting with one of the repository's top-level folders
and ending in a file extension (optionally `:LINE`) or in `/`, taken from the root or from the
naming file's folder. Paths in other projects (vLLM's,
say) start elsewhere and are not checked. Prints each missing one as FILE:LINE: PATH and exits 1.

  tests/check_paths.py [ROOT]
"""
import os
import re
import subprocess
import sys

TOP = ("runtime", "comm", "kvtransfer", "router", "kernels", "proto", "tests", "deploy",
       "common", "third_party", "tokenizer", ".ci")
EXT = r"(?:h|cc|cu|cuh|proto|md|sh|py|bazel|bzl|json|txt|yaml|yml|cfg|jinja)"
PATH = re.compile(r"(?<![\w/.:-])((?:%s)/(?:[\w.-]+/)*(?:[\w.-]+\.%s|))(?::\d+)?(?![\w/])"
                  % ("|".join(re.escape(t) for t in TOP), EXT))
SLASH_COMMENT = re.compile(r"//(.*)$")
HASH_COMMENT = re.compile(r"(?:^|\s)#(.*)$")


def comment_text(path, line):
    if path.endswith(".md"):
        return line
    if path.endswith((".h", ".cc", ".cu", ".cuh", ".proto")):
        m = SLASH_COMMENT.search(line)
        return m.group(1) if m else ""
    if path.endswith((".sh", ".py", ".bazel", ".bzl", ".yaml", ".yml")) or "/" not in path:
        m = HASH_COMMENT.search(line)
        return m.group(1) if m else ""
    return ""


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    missing = []
    for rel in files:
        if rel.startswith("third_party/") and not rel.endswith((".md", ".bazel", ".bzl")):
            continue
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                lines = f.readlines()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for n, line in enumerate(lines, 1):
            for m in PATH.finditer(comment_text(rel, line)):
                p = m.group(1)
                # From the root, or (a folder's own README) from the file's folder.
                here = os.path.join(root, os.path.dirname(rel), p)
                if not os.path.exists(os.path.join(root, p)) and not os.path.exists(here):
                    missing.append(f"{rel}:{n}: {p}")
    for m in missing:
        print(f"check_paths: names a path that does not exist: {m}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

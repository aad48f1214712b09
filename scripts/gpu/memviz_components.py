"""PyTorch's own memory viewer reads a gpumem-nb snapshot that carries components (issue 33).

Usage (on the GPU machine, with PyTorch): python3 scripts/gpu/memviz_components.py SNAPSHOT.pickle OUT_DIR

`torch.cuda._memory_viz` builds its two pages from the snapshot (`segment_plot`, `trace_plot`:
what `python -m torch.cuda._memory_viz segment_plot S.pickle -o S.html` writes), and its own
frame formatter reads every live block's stack; the bytes under each `component <name>` frame
(the last frame gpumem-nb gives a classified stack) are summed. Prints them, writes the two
pages and `memviz_components.json` to OUT_DIR, and exits 1 when the viewer fails or no block
names a component.
"""

import json
import os
import pickle
import sys

from torch.cuda import _memory_viz as viz


def frame_text(frames):
    """The stack as the viewer prints it (its own formatter, whichever this version has)."""
    if hasattr(viz, "_frames_fmt"):
        text = viz._frames_fmt(frames, full_filename=True)
    else:
        text = [viz._frame_fmt(f, full_filename=True) for f in frames]
    return text.splitlines() if isinstance(text, str) else [str(t) for t in text]


def main():
    path, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    with open(path, "rb") as f:
        data = pickle.load(f)
    pages = {}
    for name in ("segment_plot", "trace_plot"):
        html = getattr(viz, name)(data)
        pages[name] = len(html)
        with open(os.path.join(out, f"{name}.html"), "w") as f:
            f.write(html)
    by_component, blocks, unnamed = {}, 0, 0
    for seg in data.get("segments", []):
        for b in seg.get("blocks", []):
            if b.get("state") != "active_allocated":
                continue
            blocks += 1
            text = frame_text(b.get("frames", []))
            names = [line.split("component ", 1)[1].strip() for line in text if "component " in line]
            if names:
                by_component[names[-1]] = by_component.get(names[-1], 0) + b["size"]
            else:
                unnamed += b["size"]
    result = {"snapshot": path, "pages": pages, "active_blocks": blocks, "by_component": by_component, "unnamed_bytes": unnamed}
    with open(os.path.join(out, "memviz_components.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    if not by_component or min(pages.values()) == 0:
        print("FAIL: no active block names a component, or a page is empty")
        sys.exit(1)
    print("PASS: torch.cuda._memory_viz built both pages; components named:", ", ".join(sorted(by_component)))


if __name__ == "__main__":
    main()

"""The edits of docs/DESIGN.md's recipe for a per-key boolean feature, for a
dummy feature: python3 tests/recipe_dummy.py TREE edits the copy at TREE
(tests/test_recipe.sh makes it, counts the files and checks every consumer).
Each edit names its file and the line it goes after; a missing anchor fails."""
import sys

# (file, anchor line, text inserted after it): the recipe's steps.
EDITS = [
    # 1. the key field (digit 21, a shape field the fit check compares), the fd_shape
    #    field and the signature entry: one table each in gen/facts.lua
    ("gen/facts.lua", '  { name = "precision",  pos = 20, width = 1, min = 0, max = 1 },',
     '  { name = "dummy", pos = 21, width = 1, min = 0, max = 1, shape = true },'),
    ("gen/facts.lua", '  { "sink_tokens", "int" }, { "softcap", "float" }, { "features", "unsigned" },',
     '  { "dummy", "int" },'),
    ("gen/facts.lua", '  { "", "mask_mode", "mask_modes" }, { "", "layout", "layouts" },',
     '  { "x", "dummy" },'),
    # 2. the public field, last in fd_shape
    ("runtime/flashdecode.h", "  unsigned features;        /* FD_ALIBI, FD_SINK_LOGITS, ... bits (the enum above says which are served) */",
     "  int dummy;                /* the recipe's dummy feature: 0 or 1 */"),
    # 3. the code the key digit selects
    ("templates/decode.c.tpl", "void fd_k$(KEY)(const fd_work *w) {",
     "@ if DUMMY == 1 then\n  /* dummy feature on */\n@ end"),
    # 4. the key table
    ("docs/DESIGN.md", "| 18 | beams | 0, or 1: key s of row b read from cache row beam_src[b * kv_len + s] (`FD_BEAMS`; the chunk is scored in runs of one source row, and paged, one page) |",
     "| 21 | dummy | 0 or 1, fd_shape.dummy |"),
]


def main(tree):
    for path, anchor, text in EDITS:
        full = "%s/%s" % (tree, path)
        with open(full) as f:
            lines = f.read().split("\n")
        if anchor not in lines:
            sys.exit("%s: error: the recipe's anchor line is gone: %s" % (path, anchor))
        i = lines.index(anchor)
        lines[i + 1:i + 1] = text.split("\n")
        with open(full, "w") as f:
            f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

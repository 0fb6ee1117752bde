"""Every ```python block of README.md and docs/**/*.md runs, and every CLI command of a ```bash
block parses (issue 27, item 3): the docs cannot drift from the code.

How blocks run: the blocks of one file run **in order, in one namespace** (a file is one
session, as a reader types it: docs/integration.md's second block uses the model its first one
built), each file in a fresh namespace and a fresh temporary working directory (a block that
saves to "path" writes there). One test per block, id ``file:line`` (the line of its opening
fence); a block's test first runs the earlier blocks of its file that have not run yet.

An HTML comment on the lines right above a fence (invisible on GitHub and on the site) says how
to treat it:

- ``<!-- not run: REASON -->``: deliberately not runnable (a CUDA device, a download, a long
  run); reported as skipped with REASON, and never run as an earlier block either.
- ``<!-- slow: REASON -->``: run only under ``-m slow``; never run as an earlier block.
- ``<!-- setup: NAME -->``: the block continues a context the reader has and the page does not
  show (``model``: "your model"); NAME is a function of ``SETUPS`` below that makes it, small.

A line that is a bare expression followed by a Python literal in its comment
(``posenc.available()   # ['nope', ...]``) states its output: the test evaluates the expression
after the block and compares.

A block that imports an optional package that is not installed (transformers) is skipped,
naming it.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
OPTIONAL_MODULES = {"transformers", "flash_attn", "triton", "datasets", "safetensors"}

FENCE_OPEN = re.compile(r"^```([\w+-]*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*(not run|slow|setup)\s*:\s*(.+?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    source: str
    directives: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the directives in the HTML comments
    on the lines right above its fence (blank lines between them allowed)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opened = FENCE_OPEN.match(lines[i])
        if not opened:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        directives, j = {}, start - 1
        while j >= 0 and (lines[j].strip() == "" or DIRECTIVE.match(lines[j].strip())):
            found = DIRECTIVE.match(lines[j].strip())
            if found:
                directives.setdefault(found.group(1), found.group(2))
            j -= 1
        blocks.append(Block(path, start + 1, opened.group(1).lower(), "\n".join(body) + "\n", directives))
        i += 1
    return blocks


ALL_BLOCKS = [b for path in DOC_FILES for b in parse_blocks(path)]
PYTHON_BLOCKS = [b for b in ALL_BLOCKS if b.lang in ("python", "py")]
SHELL_BLOCKS = [b for b in ALL_BLOCKS if b.lang in ("bash", "sh", "shell", "console")]


# ---- the contexts a page assumes (`<!-- setup: NAME -->`) ----

def _tiny_llama(num_layers: int = 8):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config)


def setup_model(namespace: dict) -> None:
    """``model``: a tiny random Llama (8 layers, hidden 64), standing for the reader's model."""
    namespace["model"] = _tiny_llama()


def setup_saved_llama(namespace: dict) -> None:
    """A tiny Llama saved at ./path (the working directory is the file's temporary one), and
    LlamaForCausalLM imported: the checkpoint a page loads with ``from_pretrained("path")``."""
    from transformers import LlamaForCausalLM

    _tiny_llama(2).save_pretrained("path")
    namespace["LlamaForCausalLM"] = LlamaForCausalLM


SETUPS = {"model": setup_model, "saved_llama": setup_saved_llama}


# ---- running a file's blocks in sequence ----

@dataclass
class Session:
    namespace: dict
    workdir: Path
    done: set = field(default_factory=set)


_SESSIONS: dict[Path, Session] = {}


@contextlib.contextmanager
def _working_directory(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def _execute(block: Block, session: Session) -> None:
    setup = block.directives.get("setup")
    try:
        with _working_directory(session.workdir):
            if setup is not None:
                assert setup in SETUPS, f"{block.id}: unknown setup {setup!r}; known: {sorted(SETUPS)}"
                SETUPS[setup](session.namespace)
            exec(compile(block.source, block.id, "exec"), session.namespace)  # noqa: S102 (running the docs is the test)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in OPTIONAL_MODULES:
            pytest.skip(f"needs the optional package {err.name!r}, not installed")
        raise
    finally:
        session.done.add(block.line)


def _runs_as_predecessor(block: Block) -> bool:
    return "not run" not in block.directives and "slow" not in block.directives


def _session_for(block: Block, tmp_path_factory) -> Session:
    if block.path not in _SESSIONS:
        workdir = tmp_path_factory.mktemp(block.path.stem)
        _SESSIONS[block.path] = Session(namespace={"__name__": "__docs__"}, workdir=workdir)
    return _SESSIONS[block.path]


def _stated_outputs(source: str):
    """(expression source, expected value) for each line ``EXPR  # LITERAL``."""
    for line in source.splitlines():
        if "#" not in line or line.startswith((" ", "\t")):
            continue
        code, _, comment = line.partition("  #")
        try:
            expected = ast.literal_eval(comment.strip())
            tree = ast.parse(code.strip(), mode="eval")
        except (SyntaxError, ValueError):
            continue
        if isinstance(expected, (list, tuple, dict, int, float, str, bool)):
            yield ast.unparse(tree), expected


def _param(block: Block):
    marks = []
    if "not run" in block.directives:
        marks.append(pytest.mark.skip(reason=f"not run: {block.directives['not run']}"))
    if "slow" in block.directives:
        marks.append(pytest.mark.slow)
    return pytest.param(block, id=block.id, marks=marks)


@pytest.mark.parametrize("block", [_param(b) for b in PYTHON_BLOCKS])
def test_python_block_runs(block: Block, tmp_path_factory):
    session = _session_for(block, tmp_path_factory)
    earlier = [b for b in PYTHON_BLOCKS if b.path == block.path and b.line < block.line]
    for previous in earlier:
        if previous.line not in session.done and _runs_as_predecessor(previous):
            _execute(previous, session)
    _execute(block, session)
    for expression, expected in _stated_outputs(block.source):
        with _working_directory(session.workdir):
            actual = eval(expression, session.namespace)
        assert actual == expected, f"{block.id}: {expression} gives {actual!r}; the docs say {expected!r}"


def test_the_docs_have_python_blocks_and_known_directives():
    """The collection itself can fail: the parser found the README's blocks, and every
    directive names a known setup."""
    readme = [b for b in PYTHON_BLOCKS if b.path.name == "README.md"]
    assert len(readme) >= 2
    for b in PYTHON_BLOCKS:
        if "setup" in b.directives:
            assert b.directives["setup"] in SETUPS, b.id


def test_parser_on_a_hand_written_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- not run: needs a CUDA device -->\n```python\nx = 1\n```\n\n"
                    "```bash\nposenc list\n```\n```python\ny = 2  # 2\n```\n", encoding="utf-8")
    blocks = parse_blocks(page)
    assert [(b.line, b.lang, b.source) for b in blocks] == [
        (4, "python", "x = 1\n"), (8, "bash", "posenc list\n"), (11, "python", "y = 2  # 2\n")]
    assert blocks[0].directives == {"not run": "needs a CUDA device"} and blocks[2].directives == {}
    assert list(_stated_outputs("posenc.available()   # ['nope', 'rope']\nz = 3  # 3\n")) == [
        ("posenc.available()", ["nope", "rope"])]


# ---- the CLI commands of the ```bash blocks ----

def _commands(block: Block):
    """Each command of a shell block, split on ``&&``, without its trailing comment."""
    for raw in block.source.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        for part in re.split(r"\s&&\s", re.split(r"\s+#\s", line)[0]):
            yield shlex.split(part)


def _cli_args(argv: list[str]) -> list[str] | None:
    """The arguments given to posenc's CLI by a command line, or None for another program."""
    env = [a for a in argv if re.match(r"^[A-Z_]+=", a)]
    argv = argv[len(env):]
    if not argv:
        return None
    if Path(argv[0]).name == "posenc":
        return argv[1:]
    if "-m" in argv and argv[argv.index("-m") + 1] == "posenc.lab.cli":
        return argv[argv.index("-m") + 2:]
    return None


def _runnable_module(name: str) -> bool:
    """Whether ``python -m name`` finds a module to run (the lab's old root paths do not)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:  # a package runs its __main__
            spec = importlib.util.find_spec(name + ".__main__")
    except ModuleNotFoundError:
        return False
    return spec is not None


def _pyproject_extras() -> set[str]:
    """The names of pyproject.toml's [project.optional-dependencies] (tomllib is Python >= 3.11)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+)\s*=", section, flags=re.MULTILINE))


def _extras(argv: list[str]) -> list[str]:
    """The extras a ``pip install`` line asks for (``'.[a,b]'``)."""
    found = []
    for a in argv:
        m = re.fullmatch(r"\.\[([\w,-]+)\]", a)
        if m:
            found += m.group(1).split(",")
    return found


CLI_COMMANDS = [(b, argv) for b in SHELL_BLOCKS for argv in _commands(b) if _cli_args(argv) is not None]
OTHER_COMMANDS = [(b, argv) for b in SHELL_BLOCKS for argv in _commands(b) if _cli_args(argv) is None]


def _run_cli(args: list[str]) -> tuple[int, str]:
    from posenc.lab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("block,argv", [pytest.param(b, a, id=f"{b.id}:{' '.join(a)[:60]}") for b, a in CLI_COMMANDS])
def test_cli_command_parses(block: Block, argv: list[str]):
    """The command exists and its options parse: the same arguments with --help exit 0 (an
    unknown command or option exits 2, naming it). Values are not converted under --help; the
    validators' own tests (test_bad_inputs.py, test_early_failures.py) cover them."""
    args = _cli_args(argv)
    code, output = _run_cli([*args, "--help"])
    assert code == 0, f"{block.id}: `posenc {' '.join(args)}` does not parse:\n{output}"
    assert "Usage:" in output


def test_cli_list_output_has_the_shape_the_readme_gives():
    """`posenc list` shows every registered encoding with its hooks (docs/cli.md: "the
    registered encodings and the hooks each uses")."""
    import posenc

    code, output = _run_cli(["list"])
    assert code == 0
    for name in posenc.available():
        assert name in output, name
    assert "rotate" in output and "score_bias" in output


def test_cli_parser_rejects_what_a_stale_doc_would_show():
    """The check above can fail: an option that does not exist exits 2."""
    code, output = _run_cli(["extrapolate", "--no-such-option", "1", "--help"])
    assert code == 2 and "no-such-option" in output


@pytest.mark.parametrize("block,argv", [pytest.param(b, a, id=f"{b.id}:{' '.join(a)[:60]}") for b, a in OTHER_COMMANDS])
def test_other_command_refers_to_what_exists(block: Block, argv: list[str]):
    """Other programs' lines: the files and extras they name exist (a script in benchmarks/,
    constraints.txt, the extras of `pip install '.[...]'`)."""
    extras = _pyproject_extras()
    for extra in _extras(argv):
        assert extra in extras, f"{block.id}: extra {extra!r} is not in pyproject.toml ({sorted(extras)})"
    for a in argv:
        if re.fullmatch(r"(benchmarks|docs|tests|src)/[\w./-]+\.(py|sh|txt)", a) or a == "constraints.txt":
            assert (ROOT / a).exists(), f"{block.id}: {a} does not exist"
    if "-m" in argv and argv[argv.index("-m") + 1].split(".")[0] == "posenc":
        module = argv[argv.index("-m") + 1]
        assert _runnable_module(module), f"{block.id}: python -m {module}: no such module"


def test_a_stale_module_path_is_caught():
    """The check above can fail: the lab's old root path and a package without __main__ are
    not runnable, the CLI's module is."""
    assert _runnable_module("posenc.lab.cli")
    assert not _runnable_module("posenc.cli") and not _runnable_module("posenc")
    assert _cli_args(["python", "-m", "posenc.cli", "list"]) is None

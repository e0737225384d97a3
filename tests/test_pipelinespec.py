"""Pipeline specs (tui.model.pipelinespec) and their ``when`` conditions (tui.model.pexpr)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tui.model.jobspec import JobSpecError, jobspec_from_toml, load_jobspec
from tui.model.pexpr import EvalError, ExprError, Ref, parse
from tui.model.pipelinespec import (
    InputRef,
    PipelineSpec,
    RetrySpec,
    StepSpec,
    load_pipeline,
    pipeline_from_toml,
)

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# The condition language: parsing.


def shape(text: str) -> str:
    """The parse tree as a bracketed string: precedence made visible."""
    from tui.model.pexpr import And, Cmp, Literal, Not, Or, RefNode

    def s(n: Any) -> str:
        if isinstance(n, Literal):
            return repr(n.value)
        if isinstance(n, RefNode):
            return n.ref.canonical
        if isinstance(n, Cmp):
            return f"({s(n.left)} {n.op} {s(n.right)})"
        if isinstance(n, Not):
            return f"(not {s(n.operand)})"
        if isinstance(n, And):
            return "(" + " and ".join(s(x) for x in n.items) + ")"
        assert isinstance(n, Or)
        return "(" + " or ".join(s(x) for x in n.items) + ")"

    return s(parse(text).root)


@pytest.mark.parametrize(
    "text, tree",
    [
        ("true or false and false", "(True or (False and False))"),
        ("(true or false) and false", "((True or False) and False)"),
        ("not true or true", "((not True) or True)"),
        ("not (true or true)", "(not (True or True))"),
        ("not not true", "(not (not True))"),
        ("1 < 2 and 3 >= 4 or 5 == 5", "(((1 < 2) and (3 >= 4)) or (5 == 5))"),
        ("1<=2", "(1 <= 2)"),
        ("1>2", "(1 > 2)"),
        ("1 != 2", "(1 != 2)"),
        ("-1.5e-3 < .5", "(-0.0015 < 0.5)"),
        ("1E3 == 1000", "(1000.0 == 1000)"),
        ("steps.train.metrics.accuracy >= 0.9", "(steps.train.metrics.accuracy >= 0.9)"),
        ("steps.train.metrics.val/accuracy > 0", "(steps.train.metrics.val/accuracy > 0)"),
        ("steps.train.metrics.eval.loss < 1", "(steps.train.metrics.eval.loss < 1)"),
        ("steps.train.metrics['val acc'] < 1", "(steps.train.metrics['val acc'] < 1)"),
        ('steps.pre-2.state == "succeeded"', "(steps.pre-2.state == 'succeeded')"),
        ("steps.t.params.batch == 64", "(steps.t.params.batch == 64)"),
        ("((steps.t.params.flag))", "steps.t.params.flag"),
        ("true and true and true", "(True and True and True)"),
        (r"'it\'s' == 'a\\b'", "(\"it's\" == 'a\\\\b')"),
    ],
)
def test_grammar_precedence_and_operands(text: str, tree: str) -> None:
    assert shape(text) == tree


def test_strings_escape_their_quote_and_backslash_only() -> None:
    root = parse(r'"say \"hi\" \\ ok" == "x"').root
    assert root.left.value == 'say "hi" \\ ok'  # type: ignore[union-attr]
    assert parse("'a\"b' == 'c'").root.left.value == 'a"b'  # type: ignore[union-attr]


def test_refs_are_listed_once_in_order_and_compare_by_what_they_name() -> None:
    e = parse("steps.b.metrics['x'] > 1 and steps.a.state == 'succeeded' or steps.b.metrics.x < 0")
    assert e.refs() == (Ref("b", "metrics", "x"), Ref("a", "state", None))
    first = e.refs()[0]
    assert first.text == "steps.b.metrics['x']" and first.position == 0
    assert e.ref_positions()[2].position == e.text.index("steps.b.metrics.x")
    assert e.text == str(e)


@pytest.mark.parametrize(
    "text, column, message",
    [
        ("steps.train.metrics.accuracy >= ", 33, "expected a value after '>='"),
        ("steps.train.metrics.accuracy >=", 32, "expected a value after '>='"),
        ("", 1, "expected a condition"),
        ("   ", 4, "expected a condition"),
        ("1 < 2 < 3", 7, "comparisons do not chain"),
        ("(1 < 2", 7, "expected ')' to close the '(' at column 1"),
        ("1 < 2)", 6, "expected 'and', 'or' or the end, not ')'"),
        ("true and", 9, "expected a value after 'and'"),
        ("true or or", 9, "expected a value after 'or', not 'or'"),
        ("not", 4, "expected a value after 'not'"),
        ("and true", 1, "before 'and'"),
        ("accuracy > 1", 1, "expected a value, not 'accuracy'"),
        ("True", 1, "write true"),
        ("1 = 1", 3, "write '==' for '='"),
        ("true && false", 6, "write 'and' for '&&'"),
        ("'abc", 1, "a string with its closing '"),
        (r"'a\nb' == 'x'", 3, "a backslash escapes only"),
        ("steps", 6, "expected '.' then a step's name"),
        ("steps.1x.state", 7, "expected a step's name"),
        ("steps.t.metric.x > 1", 9, "expected metrics, state or params"),
        ("steps.t.metrics > 1", 16, "expected '.' then a metric's name"),
        ("steps.t.params.", 16, "expected a parameter's name"),
        ("steps.t.state.x", 14, "expected nothing after steps.t.state"),
        ("steps.t.metrics[x] > 1", 17, "expected a quoted name"),
        ("steps.t.metrics['x' > 1", 20, "expected ']'"),
        ("1.5x > 1", 1, "expected a number"),
        ("1e999 > 1", 1, "a number that fits a float"),
        ("x" * 1001, 1001, "at most 1000 characters"),
        ("(" * 33 + "true" + ")" * 33, 33, "at most 32 nested"),
        ("not " * 33 + "true", 129, "at most 32 nested"),
    ],
)
def test_parse_errors_name_their_column(text: str, column: int, message: str) -> None:
    with pytest.raises(ExprError) as info:
        parse(text)
    e = info.value
    assert e.position == column - 1
    assert message in e.message
    assert str(e) == f"at column {column}: {e.message}"
    assert isinstance(e, ValueError)


def test_nesting_up_to_the_limit_parses() -> None:
    assert parse("(" * 32 + "true" + ")" * 32).evaluate(lambda r: None) is True
    assert parse("not " * 32 + "true").evaluate(lambda r: None) is True
    assert len(parse("true or " * 124 + "true").text) <= 1000


# ---------------------------------------------------------------------------------------------
# The condition language: evaluation.


def values(**by_ref: Any) -> Any:
    """A lookup from "step.kind.key" (or "step.state") to a value; others are missing."""
    asked: list[str] = []

    def lookup(ref: Ref) -> Any:
        name = f"{ref.step}.{ref.kind}" + (f".{ref.key}" if ref.key is not None else "")
        asked.append(name)
        if name not in by_ref:
            raise EvalError(f"{ref} has no value")
        return by_ref[name]

    lookup.asked = asked  # type: ignore[attr-defined]
    return lookup


@pytest.mark.parametrize(
    "text, expected",
    [
        ("steps.t.metrics.acc >= 0.9", True),
        ("steps.t.metrics.acc > 0.93", False),
        ("steps.t.metrics.acc < 1", True),
        ("steps.t.metrics.acc <= 0.93", True),
        ("steps.t.metrics.acc == 0.93", True),
        ("steps.t.metrics.acc != 0.93", False),
        ("steps.t.metrics.steps == 100", True),  # an int metric equals the int literal
        ("steps.t.state == 'succeeded'", True),
        ("steps.t.state != \"succeeded\"", False),
        ("steps.t.params.flag", True),
        ("not steps.t.params.flag", False),
        ("steps.t.params.flag == true", True),
        ("steps.t.params.opt == 'adam' and steps.t.params.batch >= 64", True),
        ("steps.t.params.batch > 64 or steps.t.metrics.acc > 0.5", True),
        ("(1 < 2) == (3 < 4)", True),
    ],
)
def test_evaluate(text: str, expected: bool) -> None:
    lookup = values(**{"t.metrics.acc": 0.93, "t.metrics.steps": 100, "t.state": "succeeded",
                       "t.params.flag": True, "t.params.opt": "adam", "t.params.batch": 64})
    assert parse(text).evaluate(lookup) is expected


def test_and_or_short_circuit() -> None:
    lookup = values(**{"a.metrics.x": 1.0})
    # The right side is never read: a missing value there does not matter.
    assert parse("steps.a.metrics.x > 2 and steps.b.metrics.y > 0").evaluate(lookup) is False
    assert parse("steps.a.metrics.x > 0 or steps.b.metrics.y > 0").evaluate(lookup) is True
    assert lookup.asked == ["a.metrics.x", "a.metrics.x"]
    with pytest.raises(EvalError, match="steps.b.metrics.y has no value"):
        parse("steps.a.metrics.x > 0 and steps.b.metrics.y > 0").evaluate(lookup)


def test_nan_compares_false_except_not_equal() -> None:
    lookup = values(**{"a.metrics.loss": math.nan})
    for op in ("==", "<", "<=", ">", ">="):
        assert parse(f"steps.a.metrics.loss {op} 1").evaluate(lookup) is False
    assert parse("steps.a.metrics.loss != 1").evaluate(lookup) is True


@pytest.mark.parametrize(
    "text, message",
    [
        ("steps.evaluate.metrics.accuracy >= 'high'",
         "cannot compare steps.evaluate.metrics.accuracy (0.93, a number) with 'high' (a string)"),
        ("steps.evaluate.metrics.accuracy == true",
         "cannot compare steps.evaluate.metrics.accuracy (0.93, a number) with true (a boolean)"),
        ("steps.evaluate.params.flag == 1",
         "cannot compare steps.evaluate.params.flag (true, a boolean) with 1 (a number)"),
        ("steps.evaluate.state < 'z'", "strings compare only by == and !="),
        ("true > false", "booleans compare only by == and !="),
        ("steps.evaluate.metrics.accuracy",
         "steps.evaluate.metrics.accuracy (0.93, a number) is not true or false"),
        ("not steps.evaluate.state", "steps.evaluate.state ('succeeded', a string) is not true or false"),
        ("true and 1", "1 (a number) is not true or false"),
        ("steps.evaluate.params.sizes == 1", "[1, 2], a list, which is not compared"),
    ],
)
def test_evaluate_type_errors_name_both_sides(text: str, message: str) -> None:
    lookup = values(**{"evaluate.metrics.accuracy": 0.93, "evaluate.params.flag": True,
                       "evaluate.state": "succeeded", "evaluate.params.sizes": [1, 2]})
    with pytest.raises(EvalError) as info:
        parse(text).evaluate(lookup)
    assert message in str(info.value)


def test_static_check_finds_type_errors_before_running() -> None:
    kinds = {"metrics": "number", "state": "string", "params": None}
    parse("steps.a.metrics.x > 1 and steps.a.params.p == 'q'").check(lambda r: kinds[r.kind])
    with pytest.raises(ExprError) as info:
        parse("steps.a.metrics.x > 1 and steps.a.metrics.y == 'q'").check(lambda r: kinds[r.kind])
    assert info.value.position == 44
    assert "cannot compare steps.a.metrics.y (a number) with 'q' (a string)" in str(info.value)
    with pytest.raises(ExprError, match="at column 1: steps.a.metrics.x is a number, not true or false"):
        parse("steps.a.metrics.x or true").check(lambda r: kinds[r.kind])


# ---------------------------------------------------------------------------------------------
# Pipeline specs.

TRAIN_JOB = """
[steps.job]
command = ["{python}", "train.py"]
"""


def write(tmp_path: Path, text: str, **files: str) -> Path:
    for name, body in files.items():
        (tmp_path / name).write_text(textwrap.dedent(body))
    path = tmp_path / "pipeline.toml"
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, **files: str) -> PipelineSpec:
    return load_pipeline(write(tmp_path, text, **files))


def error(tmp_path: Path, text: str, **files: str) -> JobSpecError:
    with pytest.raises(JobSpecError) as info:
        load(tmp_path, text, **files)
    assert info.value.path == tmp_path / "pipeline.toml"
    return info.value


def steps(*specs: str) -> str:
    """A pipeline of inline steps: each spec is the step's own lines (a job is added)."""
    out = ['name = "p"']
    for spec in specs:
        out.append("[[steps]]\n" + textwrap.dedent(spec).strip() + "\n[steps.job]\ncommand = [\"true\"]")
    return "\n".join(out) + "\n"


PRE = """
name = "pre-job"
command = ["{python}", "pre.py"]
nodes = 3
workdir = "code"
[hyperparameters]
shards = 3
"""

EXAMPLE = """
name = "shards"
[[steps]]
name = "register"
depends_on = ["train"]
when = "steps.train.metrics.accuracy >= 0.9"
continue_from = "steps.train"
[steps.job]
command = ["{python}", "register.py"]
[[steps]]
name = "preprocess"
spec = "pre.toml"
[[steps]]
name = "train"
depends_on = ["preprocess"]
inputs = { train = "steps.preprocess.output", base = "steps.preprocess.model" }
retries = { max_attempts = 3, backoff = "10s", on = ["failed", "host_lost"] }
hyperparameters = { batch = 64 }
[steps.job]
command = ["{python}", "train.py"]
nodes = 2
workdir = "src"
[steps.job.hyperparameters]
lr = 0.1
[[steps]]
name = "evaluate"
depends_on = ["train"]
inputs = { model = "steps.train.model" }
[steps.job]
command = ["{python}", "eval.py"]
"""


def test_the_example_loads(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    p = load(tmp_path, EXAMPLE, **{"pre.toml": PRE})
    assert p.name == "shards" and p.path == tmp_path / "pipeline.toml"
    # Dependency order: register (first in the file) waits for train; evaluate and register are
    # ready together, and register comes first in the file.
    assert p.names == ("preprocess", "train", "register", "evaluate")
    assert [s.index for s in p.steps] == [1, 2, 0, 3]
    pre = p.step("preprocess")
    assert pre.kind == "job" and pre.job.name == "pre-job" and pre.job.nodes == 3
    assert pre.spec_path == str(tmp_path / "pre.toml")
    assert pre.job.workdir == str(tmp_path / "code")  # relative to the spec file
    assert pre.retries == RetrySpec() and pre.when is None and pre.depends_on == ()
    train = p.step("train")
    assert train.job.name == "train"  # an inline job is named after its step
    assert train.job.workdir == str(tmp_path / "src")  # relative to the pipeline file
    assert train.spec_path is None
    assert dict(train.job.hyperparameters) == {"lr": 0.1, "batch": 64}
    assert train.inputs == (InputRef("train", "preprocess", "output"), InputRef("base", "preprocess", "model"))
    assert train.inputs[0].text == "steps.preprocess.output"
    assert train.retries == RetrySpec(3, 10.0, ("failed", "host_lost"))
    register = p.step("register")
    assert register.continue_from == "train"
    assert register.when is not None and register.when.text == "steps.train.metrics.accuracy >= 0.9"
    assert register.when.refs() == (Ref("train", "metrics", "accuracy"),)
    assert p.upstream("register") == {"train", "preprocess"}
    assert p.upstream("preprocess") == set()
    assert p.downstream("preprocess") == {"train", "register", "evaluate"}
    assert p.downstream("train") == {"register", "evaluate"}
    assert p.downstream("evaluate") == set()
    assert [p.depth(n) for n in p.names] == [0, 1, 2, 2]
    with pytest.raises(KeyError):
        p.step("nope")


def test_round_trip_through_json(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    shutil.copy(REPO / "examples/sweep/sweep.toml", tmp_path / "sweep.toml")
    text = EXAMPLE + '[[steps]]\nname = "search"\nspec = "sweep.toml"\nhyperparameters = {extra = 1}\n'
    p = load(tmp_path, text, **{"pre.toml": PRE})
    back = PipelineSpec.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == p
    assert back.to_dict() == p.to_dict()
    assert back.step("register").when == p.step("register").when
    step = p.step("train")
    assert StepSpec.from_dict(step.to_dict()) == step


def test_a_sweep_step(tmp_path: Path) -> None:
    shutil.copy(REPO / "examples/sweep/sweep.toml", tmp_path / "sweep.toml")
    p = load(tmp_path, """
        name = "tune"
        [[steps]]
        name = "search"
        spec = "sweep.toml"
        hyperparameters = { steps = 40 }
        [[steps]]
        name = "final"
        depends_on = ["search"]
        when = "steps.search.params.optimizer == 'adamw' and steps.search.params.lr < 0.05 """
        """and steps.search.metrics.val_loss < 1"
        [steps.job]
        command = ["true"]
        """)
    search = p.step("search")
    assert search.kind == "sweep" and p.step("final").kind == "job"
    assert search.job.sweep is not None and search.job.sweep.max_trials == 30
    assert dict(search.job.hyperparameters) == {"steps": 40}
    assert search.job == dataclasses.replace(load_jobspec(tmp_path / "sweep.toml"),
                                             hyperparameters=(("steps", 40),))
    # The overlay may not fix what the sweep searches.
    e = error(tmp_path, """
        name = "tune"
        [[steps]]
        name = "search"
        spec = "sweep.toml"
        hyperparameters = { lr = 0.1 }
        """)
    assert e.field == "steps.search.hyperparameters.lr"
    assert "a name the sweep does not search" in str(e)
    # A categorical parameter's kind is known: comparing it with a number fails at load.
    e = error(tmp_path, """
        name = "tune"
        [[steps]]
        name = "search"
        spec = "sweep.toml"
        [[steps]]
        name = "final"
        depends_on = ["search"]
        when = "steps.search.params.optimizer == 1"
        [steps.job]
        command = ["true"]
        """)
    assert e.field == "steps.final.when"
    assert "cannot compare steps.search.params.optimizer (a string) with 1 (a number)" in str(e)
    # params are what the sweep searches: not its fixed hyperparameters.
    e = error(tmp_path, """
        name = "tune"
        [[steps]]
        name = "search"
        spec = "sweep.toml"
        [[steps]]
        name = "final"
        depends_on = ["search"]
        when = "steps.search.params.steps > 1 or steps.search.params.widht > 1"
        [steps.job]
        command = ["true"]
        """)
    assert e.field == "steps.final.when"
    assert ("at column 1: steps.search.params.steps: the sweep of step 'search' searches no parameter "
            "'steps' (it searches lr, width, optimizer); 'steps' is a fixed hyperparameter of its "
            "spec") in str(e)
    text = (tmp_path / "pipeline.toml").read_text()
    e = error(tmp_path, text.replace("steps.search.params.steps > 1 or ", ""))
    assert ("at column 1: steps.search.params.widht: the sweep of step 'search' searches no parameter "
            "'widht' (it searches lr, width, optimizer); did you mean 'width'?") in str(e)


def test_an_inline_sweep_step_is_checked_with_the_job_prefix(tmp_path: Path) -> None:
    e = error(tmp_path, """
        name = "tune"
        [[steps]]
        name = "search"
        [steps.job]
        command = ["train", "{hp.lr}"]
        [steps.job.sweep]
        max_trials = 2
        objective = {metric = "loss"}
        [steps.job.sweep.parameters]
        lr = {type = "float", low = 1, high = 0.1}
        """)
    assert e.field == "steps.search.job.sweep.parameters.lr.low"
    assert "low <= high" in str(e)


def test_inline_job_is_checked_like_a_job_spec_file(tmp_path: Path) -> None:
    # The same table, as a file and inline: the same error, the field prefixed.
    body = 'command = ["x"]\nnodes = 0\n'
    with pytest.raises(JobSpecError) as file_error:
        jobspec_from_toml('name = "j"\n' + body, tmp_path / "j.toml")
    e = error(tmp_path, 'name = "p"\n[[steps]]\nname = "a"\n[steps.job]\n' + body)
    assert file_error.value.field == "nodes" and e.field == "steps.a.job.nodes"
    assert e.expected == file_error.value.expected and e.got == 0
    e = error(tmp_path, 'name = "p"\n[[steps]]\nname = "a"\n[steps.job]\ncomand = ["x"]\n')
    assert e.field == "steps.a.job.comand" and "did you mean 'command'?" in str(e)
    e = error(tmp_path, 'name = "p"\n[[steps]]\nname = "a"\n[steps.job]\nnodes = 1\n')
    assert e.field == "steps.a.job.command" and "(required)" in str(e)
    e = error(tmp_path, 'name = "p"\n[[steps]]\nname = "a"\n[steps.job]\ncommand = ["x\\u0000"]\n')
    assert e.field == "steps.a.job.command[0]" and "NUL" in str(e)
    e = error(tmp_path, 'name = "p"\n[[steps]]\nname = "a"\n[steps.job]\ncommand = ["x"]\n'
                        '[steps.job.restart]\nmax_restarts = -1\n')
    assert e.field == "steps.a.job.restart.max_restarts"
    e = error(tmp_path, 'name = "p"\n[[steps]]\nname = "a"\n[steps.job]\ncommand = ["x"]\n'
                        '[steps.job.code]\nsync = "nowhere"\n')
    assert e.field == "steps.a.job.code.sync" and "an existing directory" in str(e)
    (tmp_path / "src").mkdir()
    p = load(tmp_path, 'name = "p"\n[[steps]]\nname = "a"\n[steps.job]\nname = "own"\ncommand = ["x"]\n'
                       '[steps.job.code]\nsync = "src"\n')
    job = p.step("a").job
    assert job.name == "own" and job.code is not None and job.code.sync == str(tmp_path / "src")
    assert job.workdir == str(tmp_path / "src")


def test_a_step_spec_that_does_not_load_keeps_its_own_error(tmp_path: Path) -> None:
    e = error(tmp_path, 'name = "p"\n[[steps]]\nname = "train"\nspec = "train.toml"\n',
              **{"train.toml": 'name = "t"\ncommand = "python train.py"\n'})
    assert e.field == "steps.train.spec"
    inner = f"{tmp_path / 'train.toml'}: field 'command': expected a non-empty list"
    assert f"a job spec that loads ({inner}" in str(e)
    e = error(tmp_path, 'name = "p"\n[[steps]]\nname = "train"\nspec = "missing.toml"\n')
    assert e.field == "steps.train.spec" and "an existing job spec file" in str(e)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "t.toml").write_text('name = "t"\ncommand = ["x"]\n')
    p = load(tmp_path, 'name = "p"\n[[steps]]\nname = "train"\nspec = "sub/t.toml"\n')
    assert p.step("train").job.workdir == str(sub)  # the spec file's own directory
    assert p.step("train").spec_path == str(sub / "t.toml")


@pytest.mark.parametrize(
    "text, field, words",
    [
        # The file and its steps.
        ('name = "p"\n', "steps", "at least one step"),
        ('name = "p"\nsteps = []\n', "steps", "at least one step"),
        ('name = "p"\nsteps = 3\n', "steps", "an array of tables"),
        ('[[steps]]\nname = "a"\n', "name", "a pipeline name of 1-64 letters"),
        ('name = "p q"\n[[steps]]\nname = "a"\n', "name", "a pipeline name"),
        ('name = "p"\nstep = 1\n', "step", "did you mean 'steps'?"),
        # A step's own fields.
        ('name = "p"\n[[steps]]\nspec = "x.toml"\n', "steps[0].name", "(required)"),
        ('name = "p"\n[[steps]]\nname = "1a"\n', "steps[0].name", "a step name"),
        ('name = "p"\n[[steps]]\nname = "' + "a" * 41 + '"\n', "steps[0].name", "at most 40"),
        (steps('name = "a"\ndepend_on = []'), "steps.a.depend_on", "did you mean 'depends_on'?"),
        ('name = "p"\n[[steps]]\nname = "a"\n', "steps.a.spec", "(required)"),
        ('name = "p"\n[[steps]]\nname = "a"\nspec = "x.toml"\n[steps.job]\ncommand = ["x"]\n',
         "steps.a.spec", "not both"),
        ('name = "p"\n[[steps]]\nname = "a"\njob = "x"\n', "steps.a.job", "a table ([steps.job])"),
        ('name = "p"\n[[steps]]\nname = "a"\nspec = ""\n', "steps.a.spec", "a job or sweep spec file"),
        (steps('name = "a"', 'name = "a"'), "steps[1].name", "steps[0] is also called 'a'"),
        (steps('name = "a"\ndepends_on = "b"', 'name = "b"'), "steps.a.depends_on", "a list of step names"),
        (steps('name = "a"\ndepends_on = ["b", "b"]', 'name = "b"'), "steps.a.depends_on", "without repeats"),
        (steps('name = "a"\ndepends_on = ["a"]'), "steps.a.depends_on", "cannot depend on itself"),
        ('name = "p"\n[[steps]]\nname = "a"\nspec = "x\\u0000.toml"\n', "steps.a.spec", "NUL"),
        (steps('name = "a"\nhyperparameters = {h = "x\\u0000"}'), "steps.a.hyperparameters.h", "NUL"),
        # Retries.
        (steps('name = "a"\nretries = 3'), "steps.a.retries", "a table"),
        (steps('name = "a"\nretries = {max_attempts = 0}'), "steps.a.retries.max_attempts", "1..100"),
        (steps('name = "a"\nretries = {max_attempts = 101}'), "steps.a.retries.max_attempts", "1..100"),
        (steps('name = "a"\nretries = {max_attempts = true}'), "steps.a.retries.max_attempts", "1..100"),
        (steps('name = "a"\nretries = {backoff = "2h"}'), "steps.a.retries.backoff", "at most 1h"),
        (steps('name = "a"\nretries = {backoff = "soon"}'), "steps.a.retries.backoff", "a duration"),
        (steps('name = "a"\nretries = {on = []}'), "steps.a.retries.on", "a non-empty list"),
        (steps('name = "a"\nretries = {on = ["oom"]}'), "steps.a.retries.on", '"failed", "host_lost"'),
        (steps('name = "a"\nretries = {on = ["failed", "failed"]}'), "steps.a.retries.on", "without repeats"),
        (steps('name = "a"\nretries = {attempts = 2}'), "steps.a.retries.attempts", "did you mean 'max_attempts'?"),
        # Inputs.
        (steps('name = "a"\ninputs = ["x"]'), "steps.a.inputs", "a table of channels"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ninputs = {"1x" = "steps.b.output"}'),
         "steps.a.inputs", "channel names of letters"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ninputs = {x = "b.output"}'),
         "steps.a.inputs.x", '"steps.STEP.output"'),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ninputs = {x = "steps.b.outputs"}'),
         "steps.a.inputs.x", "did you mean 'steps.b.output'?"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ninputs = {x = 1}'),
         "steps.a.inputs.x", "an artifact of an upstream step"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ninputs = {x = "steps.b.output", X = "steps.b.model"}'),
         "steps.a.inputs.X", "also SM_CHANNEL_X"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ninputs = {x = "steps.a.output"}'),
         "steps.a.inputs.x", "not of this one"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ninputs = {x = "steps.c.output"}'),
         "steps.a.inputs.x", "a step of this pipeline (b, a)"),
        # Hyperparameters laid over the job's.
        (steps('name = "a"\nhyperparameters = 3'), "steps.a.hyperparameters", "a table of hyperparameters"),
        (steps('name = "a"\nhyperparameters = {"a=b" = 1}'), "steps.a.hyperparameters", "no '='"),
        (steps('name = "a"\nhyperparameters = {d = 2024-01-01}'), "steps.a.hyperparameters.d", "no dates"),
        # continue_from.
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ncontinue_from = "b"'),
         "steps.a.continue_from", 'write "steps.b"'),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\ncontinue_from = "steps.a"'),
         "steps.a.continue_from", "cannot continue from itself"),
        (steps('name = "bb"', 'name = "a"\ndepends_on = ["bb"]\ncontinue_from = "steps.b"'),
         "steps.a.continue_from", "did you mean 'bb'?"),
        (steps('name = "b"', 'name = "a"\ncontinue_from = "steps.b"'),
         "steps.a.continue_from", "'b' is not upstream of 'a'"),
        # when.
        (steps('name = "a"\nwhen = 1'), "steps.a.when", "a condition as a string"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\nwhen = "steps.b.metrics.x >= "'),
         "steps.a.when", "at column 22: expected a value after '>='"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\nwhen = "steps.a.state == \'succeeded\'"'),
         "steps.a.when", "at column 1: steps.a.state is this step's own"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\nwhen = "steps.b.params.lr > 1"'),
         "steps.a.when", "at column 1: steps.b.params.lr: params are a sweep step's parameters (its "
                         "best trial's), and 'b' is a job"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\nwhen = "steps.b.state == \'cached\'"'),
         "steps.a.when", "at column 18: a cached step's state reads as 'succeeded'"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\nwhen = "steps.b.state == \'succeded\'"'),
         "steps.a.when", "at column 18: a step's state is one of succeeded, cached, failed, skipped, "
                         "stopped, not 'succeded' (did you mean 'succeeded'?)"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\nwhen = "steps.b.metrics.x"'),
         "steps.a.when", "at column 1: steps.b.metrics.x is a number, not true or false"),
        (steps('name = "b"', 'name = "a"\ndepends_on = ["b"]\nwhen = "steps.b.state > 1"'),
         "steps.a.when", "at column 15: cannot compare steps.b.state (a string) with 1 (a number)"),
    ],
)
def test_spec_errors_name_the_field(tmp_path: Path, text: str, field: str, words: str) -> None:
    e = error(tmp_path, text)
    assert e.field == field
    assert words in str(e), str(e)


def test_unknown_step_in_depends_on_lists_the_steps_and_the_nearest(tmp_path: Path) -> None:
    e = error(tmp_path, steps('name = "preprocess"', 'name = "train"\ndepends_on = ["preproces"]'))
    assert e.field == "steps.train.depends_on" and e.got == "preproces"
    assert str(e) == (f"{tmp_path / 'pipeline.toml'}: field 'steps.train.depends_on': expected a step "
                      "of this pipeline (preprocess, train); did you mean 'preprocess'?, got "
                      '"preproces" (string)')


def test_unknown_step_in_when(tmp_path: Path) -> None:
    e = error(tmp_path, steps('name = "train"', 'name = "reg"\ndepends_on = ["train"]\n'
                              'when = "steps.train.state == \'succeeded\' and steps.trian.metrics.acc > 1"'))
    assert e.field == "steps.reg.when"
    assert ("at column 38: steps.trian.metrics.acc: no step is called 'trian' (the steps are "
            "train, reg); did you mean 'train'?") in str(e)


def test_when_reading_a_step_that_is_not_upstream_says_to_add_it(tmp_path: Path) -> None:
    e = error(tmp_path, steps('name = "train"', 'name = "evaluate"\ndepends_on = ["train"]',
                              'name = "reg"\ndepends_on = ["train"]\n'
                              'when = "steps.evaluate.metrics.accuracy >= 0.9"'))
    assert e.field == "steps.reg.when"
    assert ("at column 1: 'evaluate' is not upstream of 'reg' (a step reads only the steps it "
            "depends on, directly or through others): add 'evaluate' to steps.reg.depends_on") in str(e)
    # Through another step it is upstream.
    p = load(tmp_path, steps('name = "train"', 'name = "evaluate"\ndepends_on = ["train"]',
                             'name = "reg"\ndepends_on = ["evaluate"]\n'
                             'when = "steps.train.metrics.accuracy >= 0.9"'))
    assert p.step("reg").when is not None


def test_input_from_a_step_that_is_not_upstream(tmp_path: Path) -> None:
    e = error(tmp_path, steps('name = "pre"', 'name = "train"\ninputs = {data = "steps.pre.output"}'))
    assert e.field == "steps.train.inputs.data"
    assert "'pre' is not upstream of 'train'" in str(e)
    assert "add 'pre' to steps.train.depends_on" in str(e)


def test_input_channel_must_not_repeat_a_channel_of_the_job(tmp_path: Path) -> None:
    e = error(tmp_path, """
        name = "p"
        [[steps]]
        name = "pre"
        [steps.job]
        command = ["x"]
        [[steps]]
        name = "train"
        depends_on = ["pre"]
        inputs = { train = "steps.pre.output" }
        [steps.job]
        command = ["x"]
        channels = { train = "/data/train" }
        """)
    assert e.field == "steps.train.inputs.train"
    assert "a channel the job does not also define in its own channels" in str(e)


@pytest.mark.parametrize(
    "deps, field, ring",
    [
        ({"a": ["c"], "b": ["a"], "c": ["b"]}, "steps.a.depends_on", "a -> c -> b -> a"),
        ({"x": [], "b": ["c"], "c": ["b"]}, "steps.b.depends_on", "b -> c -> b"),
        ({"a": ["b"], "b": ["c"], "c": ["d"], "d": ["b"]}, "steps.b.depends_on", "b -> c -> d -> b"),
    ],
)
def test_a_cycle_is_named(tmp_path: Path, deps: dict[str, list[str]], field: str, ring: str) -> None:
    text = steps(*(f'name = "{n}"\ndepends_on = {json.dumps(d)}' for n, d in deps.items()))
    e = error(tmp_path, text)
    assert e.field == field
    assert e.expected == f"steps without a cycle; these form one: {ring} (each depends on the next)"


def test_too_many_steps(tmp_path: Path) -> None:
    e = error(tmp_path, steps(*(f'name = "s{i}"' for i in range(201))))
    assert e.field == "steps" and "at most 200 steps; this pipeline has 201" in str(e)
    assert len(load(tmp_path, steps(*(f'name = "s{i}"' for i in range(200)))).steps) == 200


def test_a_long_chain_needs_no_deep_recursion(tmp_path: Path) -> None:
    chain = [f'name = "s{i}"' + (f'\ndepends_on = ["s{i + 1}"]' if i < 199 else "") for i in range(200)]
    p = load(tmp_path, steps(*chain))
    assert p.names[0] == "s199" and p.names[-1] == "s0"
    assert p.upstream("s0") == {f"s{i}" for i in range(1, 200)}
    assert p.depth("s0") == 199


def test_dependency_order_is_file_order_among_ready_steps(tmp_path: Path) -> None:
    p = load(tmp_path, steps('name = "d"\ndepends_on = ["b", "c"]', 'name = "c"', 'name = "b"\ndepends_on = ["c"]',
                             'name = "a"'))
    assert p.names == ("c", "b", "d", "a")
    for i, s in enumerate(p.steps):
        assert set(s.depends_on) <= set(p.names[:i])


def test_pipeline_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="expected an existing pipeline spec file"):
        load_pipeline(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'name = "\xff"\n')
    with pytest.raises(JobSpecError, match="expected UTF-8 text"):
        load_pipeline(bad)
    bad.write_text("name = \n")
    with pytest.raises(JobSpecError) as info:
        load_pipeline(bad)
    assert info.value.path == bad and info.value.field is None and "valid TOML" in str(info.value)
    with pytest.raises(JobSpecError, match="<job spec>: field 'steps'"):
        pipeline_from_toml('name = "p"\n')


def test_retry_delays_double_and_stop_at_an_hour() -> None:
    r = RetrySpec(max_attempts=5, backoff_s=10.0)
    assert [r.delay(n) for n in (1, 2, 3, 4)] == [10.0, 20.0, 40.0, 80.0]
    assert RetrySpec(max_attempts=100, backoff_s=3000.0).delay(2) == 3600.0
    assert RetrySpec(max_attempts=100, backoff_s=1.0).delay(99) == 3600.0
    assert RetrySpec().delay(1) == 0.0
    assert r.retries(4, "failed") and not r.retries(5, "failed")
    assert not RetrySpec(max_attempts=3, on=("host_lost",)).retries(1, "failed")
    assert RetrySpec(max_attempts=3, on=("host_lost",)).retries(1, "host_lost")

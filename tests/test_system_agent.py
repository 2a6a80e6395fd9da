"""Chapter 08 part 2, agents: the calculator evaluates arithmetic and nothing else, a tool call parses only
from a well-formed object, the loop stops at an answer or at its budget (the scripted policy solves a task
exactly when the budget covers its plan plus the answer), a model policy's history is a prefix of its next
prompt (what lets a prefix cache work), and the exercise's formula and checker."""

import pytest

pytest.importorskip("rank_bm25")

from course_lib.exercises import ch08  # noqa: E402
from course_lib.system import agent  # noqa: E402
from course_lib.system.retrieval import BM25Retriever  # noqa: E402
from course_lib.system.stdlib_corpus import build_corpus  # noqa: E402
from course_lib.system.tools import (  # noqa: E402
    DocsLookup,
    ToolCall,
    calculator,
    call_schema,
    parse_tool_call,
    run_tool,
)

TOOLS = {"calculator": calculator, "docs": lambda q: f"doc for {q}"}


def test_calculator_is_arithmetic_only():
    assert calculator("37*41") == "1517" and calculator("(17+5)*3") == "66" and calculator("0.6*100") == "60"
    assert calculator("7/2") == "3.5" and calculator("-2**3") == "-8"
    for bad in ("__import__('os')", "abs(-1)", "x + 1", "2**1000", "1/0", "", "2 +"):
        with pytest.raises(ValueError, match="expression"):
            calculator(bad)


def test_parse_tool_call():
    assert parse_tool_call('{"tool": "calculator", "input": "1+1"}', TOOLS) == ToolCall("calculator", "1+1")
    assert parse_tool_call('Sure! {"tool": "answer", "input": "2"} done', TOOLS) == ToolCall("answer", "2")
    # prose, an unknown tool, a non-string input, a cut object: no call (the 'parsable' claim can fail)
    for text in ("The answer is 1517.", '{"tool": "web", "input": "x"}', '{"tool": "docs", "input": 3}',
                 '{"tool": "docs", "input": "x"'):  # fmt: skip
        assert parse_tool_call(text, TOOLS) is None
    assert call_schema(TOOLS)["properties"]["tool"]["enum"] == ["calculator", "docs", "answer"]
    with pytest.raises(ValueError, match="tools"):
        parse_tool_call("{}", {"answer": calculator})
    assert run_tool(ToolCall("calculator", "1/0"), TOOLS).startswith("error:")
    assert run_tool(ToolCall("web", "x"), TOOLS).startswith("error: no tool")


def test_docs_lookup_finds_the_plan_document():
    lookup = DocsLookup(BM25Retriever(build_corpus(["difflib"])))
    assert lookup("difflib get_close_matches cutoff").startswith("difflib.get_close_matches")
    with pytest.raises(ValueError, match="retriever"):
        DocsLookup(None)


def test_scripted_policy_and_budget():
    tools = {"calculator": calculator, "docs": DocsLookup(BM25Retriever(build_corpus(["difflib"])))}
    for budget in (1, 2, 3, 4):
        runs = agent.run_agents(agent.TASKS, agent.ScriptedPolicy(), tools, max_calls=budget)
        for r in runs:
            needs = len(r.task["plan"]) + 1
            assert (r.answer is not None) == (needs <= budget), (r.task["id"], budget)
            assert len(r.steps) <= budget
    assert all(r.correct for r in agent.run_agents(agent.TASKS, agent.ScriptedPolicy(), tools, max_calls=4))
    with pytest.raises(ValueError, match="max_calls"):
        agent.run_agents(agent.TASKS, agent.ScriptedPolicy(), tools, max_calls=0)
    with pytest.raises(ValueError, match="tasks"):
        agent.run_agents([{"question": "x"}], agent.ScriptedPolicy(), tools)
    with pytest.raises(ValueError, match="policy"):
        agent.run_agents(agent.TASKS, object(), tools)


class _Tok:
    chat_template = "x"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}</s>" for m in messages) + "<assistant>"


class _Result:
    def __init__(self, prompt, text):
        from course_lib.measure.metrics import RequestTrace

        self.prompt_ids, self.output_ids, self.text = list(prompt), [1, 2, 3], text
        self.trace = RequestTrace(0, 0.0, len(prompt), [0.1, 0.2, 0.3])


class _Engine:
    """Stands in for Engine: answers a fixed call, records the prompts it was sent."""

    def __init__(self, reply):
        self.tokenizer, self.reply, self.prompts, self.backend = _Tok(), reply, [], None

    def generate(self, prompts, params):
        self.prompts.append(list(prompts))
        return [_Result(p, self.reply) for p in prompts]


def test_model_policy_history_is_a_prefix_and_budget_stops_it():
    engine = _Engine('{"tool": "calculator", "input": "2+2"}')  # never answers: only the budget stops it
    policy = agent.ModelPolicy(engine, TOOLS, constrained=True)
    runs = agent.run_agents(agent.TASKS[:2], policy, TOOLS, max_calls=3)
    assert all(r.answer is None and len(r.steps) == 3 for r in runs)
    assert [b["requests"] for b in policy.batches] == [2, 2, 2]
    first, second = engine.prompts[0][0], engine.prompts[1][0]
    assert second.startswith(first.removesuffix("<assistant>"))  # the next prompt extends the history
    assert runs[0].steps[0].observation == "4"
    answering = agent.ModelPolicy(_Engine('{"tool": "answer", "input": "1517"}'), TOOLS)
    [run] = agent.run_agents(agent.TASKS[:1], answering, TOOLS, max_calls=3)
    assert run.correct and run.steps == []
    with pytest.raises(ValueError, match="chat model"):
        agent.ModelPolicy(object(), TOOLS)


def test_first_calls_rates():
    prose = agent.first_calls(_Engine("The answer is 1517."), agent.TASKS[:2], TOOLS, constrained=False)
    assert prose["parsable"] == 0 and prose["right_call"] == 0
    right = agent.first_calls(_Engine('{"tool": "calculator", "input": "41*37"}'), agent.TASKS[:2], TOOLS, True)
    assert right["parsable"] == 1 and right["right_tool"] == 1 and right["right_call"] == 0.5  # 41*37 = 37*41
    rates = agent.call_rates(['{"tool": "docs", "input": "x"}', "no call"], agent.TASKS[:2], TOOLS)
    assert rates["parsable"] == 0.5 and rates["right_tool"] == 0  # the plans start with the calculator
    with pytest.raises(ValueError, match="texts"):
        agent.call_rates(["one reply"], agent.TASKS[:2], TOOLS)


def test_exercise_agent_tokens():
    assert ch08.agent_prompt_tokens(140, 60, 5) == 1300 and ch08.agent_prompt_tokens(140, 60, 1) == 140
    assert ch08.check_agent_tokens(1300, 140, 60, 5)
    with pytest.raises(AssertionError):
        ch08.check_agent_tokens(5 * 140 + 60 * 5, 140, 60, 5)  # the history counted once, not resent
    assert not ch08.check_agent_tokens(None, 140, 60, 5)
    with pytest.raises(ValueError, match="answer"):
        ch08.check_agent_tokens(1300.0, 140, 60, 5)
    with pytest.raises(ValueError, match="calls"):
        ch08.agent_prompt_tokens(140, 60, 0)

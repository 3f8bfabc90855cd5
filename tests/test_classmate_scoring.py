"""Classmate answers scored through the main reward path: a user's reward function file or real HTTP reward servers
on 127.0.0.1, through upstream's own ``SingleTurnAgentExecutor`` methods; failures are invalid, never 0."""

import json
import threading

import pytest
from aiohttp import web

from openrlhf_classmate.integration.classmate.classmate_scoring import (
    ClassmateAnswer,
    RewardPathScorer,
    interpret_reward,
    reward_query,
)

LABEL = {"data_source": "arithmetic", "ground_truth": "3"}


def _answer(text: str, opened: bool = False) -> ClassmateAnswer:
    return ClassmateAnswer(text=text, label=LABEL, prompt="<|user|>\n1 + 2 ?<eos>\n<|assistant|>\n", cot="1 + 2 = 3",
                           prompt_opens_think=opened)


def test_reward_query_reads_like_a_main_response():
    assert reward_query(_answer("3"), "<think>", "</think>") == (
        "<|user|>\n1 + 2 ?<eos>\n<|assistant|>\n<think>1 + 2 = 3</think>\n\n3")
    # the template already opened the think block: no second tag
    assert reward_query(_answer("3", opened=True), "<think>", "</think>").count("<think>") == 0


@pytest.mark.parametrize("reply, score, valid", [
    ({"rewards": 0.5}, 0.5, True), ({"rewards": [2.0], "extra_logs": {"main_valid": 1.0}}, 2.0, True),
    ({"rewards": 1.0, "extra_logs": {"main_valid": 0.0}}, 0.0, False), ({"rewards": float("nan")}, 0.0, False),
    ({"rewards": None}, 0.0, False), ({"rewards": [1.0, 2.0]}, 0.0, False), ("oops", 0.0, False), (None, 0.0, False),
])
def test_interpret_reward(reply, score, valid):
    result = interpret_reward(reply)
    assert (result.score, result.valid) == (score, valid)
    assert (result.reason is None) == valid


def test_a_users_reward_function_file(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(
        "def reward_func(queries, prompts, labels, **kwargs):\n"
        "    answer = queries[0].rsplit('</think>', 1)[-1].strip()\n"
        "    if answer == 'boom':\n"
        "        raise RuntimeError('the user function failed')\n"
        "    return {'rewards': float(answer == '3'), 'scores': 0.0, 'extra_logs': {}}\n")
    scorer = RewardPathScorer([str(path)], "<think>", "</think>")
    results = scorer([_answer("3"), _answer("4"), _answer("boom")])
    assert [(r.score, r.valid) for r in results] == [(1.0, True), (0.0, True), (0.0, False)]
    assert "the user function failed" in results[2].reason


class _Server:
    """A real reward server on 127.0.0.1 (upstream's HTTP payload: query / prompts / labels)."""

    def __init__(self, status=200):
        self.status, self.payloads = status, []
        self.ready = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        assert self.ready.wait(10)

    def _serve(self):
        import asyncio

        async def handle(request):
            payload = await request.json()
            self.payloads.append(payload)
            if self.status != 200:
                return web.Response(status=self.status)
            answer = payload["query"][0].rsplit("</think>", 1)[-1].strip()
            return web.json_response({"rewards": [float(answer == json.loads(payload["labels"][0])["ground_truth"])]})

        async def main():
            app = web.Application()
            app.router.add_post("/reward", handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/reward"
            self.ready.set()
            await asyncio.Event().wait()

        asyncio.run(main())


def test_http_reward_servers():
    server = _Server()
    scorer = RewardPathScorer([server.url], "<think>", "</think>")
    results = scorer([_answer("3"), _answer("2")])
    assert [(r.score, r.valid) for r in results] == [(1.0, True), (0.0, True)]
    assert server.payloads[0]["prompts"] == [_answer("3").prompt]
    assert server.payloads[0]["query"][0].endswith("<think>1 + 2 = 3</think>\n\n3")


@pytest.mark.slow
def test_a_failing_reward_server_makes_the_score_invalid_not_zero():
    server = _Server(status=503)  # upstream retries 5 times, 1 s apart, then gives up
    (result,) = RewardPathScorer([server.url], "<think>", "</think>")([_answer("3")])
    assert not result.valid and "RuntimeError" in result.reason
    assert len(server.payloads) == 5

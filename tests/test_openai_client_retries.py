# ruff: noqa: F811 - the tests take the imported `server` fixture by name
"""The openai client wrapper's retries, against the recording loopback server of
test_openai_client: what is retried (5xx, 408, 429 after Retry-After, connection errors) and
what is not (other 4xx), and that `max_retries` says how many retries happen."""

from __future__ import annotations

import time

import openai
import pytest
from test_openai_client import FAST_RETRY, MSG, server  # noqa: F401 - `server`: the recording server fixture

from topas_agents import label
from topas_agents.integrations.openai_client import labelled


def test_raw_response_variant_is_retried(server):
    url, rec = server
    rec.statuses = [503]
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="t-raw", stage="s", agent="a"):
        raw = client.chat.completions.with_raw_response.create(model="m", messages=MSG)
    assert raw.status_code == 200 and len(rec.requests) == 2


def test_retries_5xx_then_succeeds(server):
    url, rec = server
    rec.statuses = [503, 500]
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with label(task_id="t", stage="s", agent="a"):
        out = client.chat.completions.create(model="m", messages=MSG)
    assert out.choices[0].message.content == "ok"
    assert len(rec.requests) == 3


def test_never_retries_4xx(server):
    url, rec = server
    rec.statuses = [400]
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=MSG)
    assert len(rec.requests) == 1


def test_rate_limits_are_retried_after_the_servers_retry_after(server):
    """openai retries 408/429 (and waits Retry-After); labelled() switched its retries off and
    raised the first 429. A 409 (a Topas task marked done) stays final."""
    url, rec = server
    rec.statuses = [429, 408]
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    t0 = time.monotonic()
    with label(task_id="t-429", stage="s", agent="a"):
        assert client.chat.completions.create(model="m", messages=MSG).choices[0].message.content == "ok"
    assert len(rec.requests) == 3 and time.monotonic() - t0 >= 0.3  # waited the Retry-After
    rec.statuses = [409]
    with pytest.raises(openai.ConflictError):
        client.chat.completions.create(model="m", messages=MSG)
    assert len(rec.requests) == 4


def test_the_clients_own_max_retries_is_the_retry_policy(server):
    url, rec = server
    rec.statuses = [503, 503]
    client = labelled(openai.OpenAI(base_url=url, api_key="x", max_retries=0))  # the caller wants none
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=MSG)
    assert len(rec.requests) == 1


def test_connection_error_retried_then_raised():
    client = labelled(openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", timeout=1.0), FAST_RETRY)
    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=MSG)


def test_with_options_and_copy_set_the_wrappers_retries(server):
    # before: labelled(c).with_options(max_retries=0) / .copy(max_retries=0) kept the old policy
    # and still made every attempt of it
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY)
    for variant, retries in ((client.with_options(max_retries=0), 0), (client.copy(max_retries=1), 1)):
        rec.requests.clear()
        rec.statuses = [503] * FAST_RETRY.attempts
        with pytest.raises(openai.InternalServerError):
            variant.chat.completions.create(model="m", messages=MSG)
        assert variant.max_retries == retries and len(rec.requests) == retries + 1
    assert client.with_options(timeout=5).max_retries == FAST_RETRY.attempts - 1  # the policy carries over


def test_max_retries_says_how_many_retries_happen(server):
    # before: labelled(OpenAI()) reported openai's max_retries (2) but retried 3 times, and an
    # explicit OpenAI(max_retries=2) could not be told from the default
    url, rec = server
    client = labelled(openai.OpenAI(base_url=url, api_key="x"))
    assert client.max_retries == openai.DEFAULT_MAX_RETRIES
    rec.statuses = [503] * (client.max_retries + 2)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="m", messages=MSG)
    assert len(rec.requests) == client.max_retries + 1
    assert labelled(openai.OpenAI(base_url=url, api_key="x"), FAST_RETRY).max_retries == FAST_RETRY.attempts - 1

"""The admin's Limits page (SPEC sections 7 and 14), through Django's test
client against a real Redis: the figures, setting and resetting a limit
(POST, CSRF, permissions), one limiter's holders and waiting jobs, garbage
in Redis and Redis down; and once in a real browser (headless Chromium)."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.contrib.auth.models import User

from django_cogworker import limits
from django_cogworker.admin.helpers import segment
from tests import test_admin
from tests.conftest import wait_for
from tests.test_admin import client_for, messages_of, queue_jids, text
from tests.test_admin_browser import BASE, PASSWORD, Shots, chromium, login
from tests.test_api_limits import IDENTITY, admit

LIMITS = BASE + "limits/"

#: Users of each kind (a fixture).
users = test_admin.users
XSS = "<script>alert('x')</script>"


def limit_url(name: str, tail: str = "") -> str:
    return f"{LIMITS}{segment(name).replace('%', '%25')}/{tail}"


@pytest.fixture
def erp(cog) -> limits.Concurrency:
    """``erp`` (2) with both slots held and three jobs waiting."""
    cog.configure(ENQUEUE_ON_COMMIT=False)
    limiter = limits.Concurrency("erp", 2)
    for i in range(5):
        admit(limiter, f"j{i}")
    return limiter


def rows(body: str) -> dict[str, str]:
    """The limits table's rows: limiter name -> the row's text."""
    found = {}
    for row in re.findall(r"<tr>\s*<th scope=\"row\">(.*?)</tr>", body, re.S):
        cells = [unescape(re.sub(r"<[^>]+>", " ", c)).split() for c in re.split(r"</t[hd]>", row)]
        found[" ".join(cells[0])] = " | ".join(" ".join(c) for c in cells[1:])
    return found


# -- the list -------------------------------------------------------------------------------


def test_the_list_shows_kind_limit_holders_and_waiting(cog, users, erp):
    admit(limits.Rate("stripe", 5, per=60), "s1")
    cog.redis.set(cog.key("limit:stripe:max"), 9)
    response = client_for(users["super"]).get(LIMITS)
    assert response.status_code == 200
    body = text(response)
    assert 'aria-current="page">Limits' in body  # its tab
    shown = rows(body)
    assert shown["erp"].startswith("concurrency | 2 | 2 | 3 |")
    assert shown["stripe"].startswith("rate, per 60 s | 9 override (declared: 5) | 1 | 0 |")
    assert body.count('name="action" value="reset"') == 1  # only an override can be reset


def test_a_view_only_user_sees_no_form_and_cannot_post(cog, users, erp):
    viewer = client_for(users["viewer"])
    body = text(viewer.get(LIMITS))
    assert "erp" in body and 'name="action"' not in body
    assert viewer.post(limit_url("erp", "set/"), {"action": "set", "n": "5"}).status_code == 403
    assert cog.redis.exists(cog.key("limit:erp:max")) == 0
    assert client_for(users["staff"]).get(LIMITS).status_code == 403
    assert client_for(users["plain"]).get(LIMITS).status_code == 302  # to the login
    assert client_for(None).get(limit_url("erp")).status_code == 302


def test_an_empty_namespace_says_no_limiter_was_used(cog, superclient):
    body = text(superclient.get(LIMITS))
    assert "No limiter has been used yet" in body


# -- changing a limit ----------------------------------------------------------------------


def test_setting_a_limit_takes_effect_at_once_and_lets_waiters_in(cog, superclient, erp):
    response = superclient.post(limit_url("erp", "set/"), {"action": "set", "n": "3"}, follow=True)
    assert response.redirect_chain == [(LIMITS, 302)]
    assert messages_of(response) == ["Limiter erp set to 3. 1 waiting job let in."]
    assert cog.redis.get(cog.key("limit:erp:max")) == b"3"
    assert queue_jids(cog) == ["j2"]
    assert rows(text(response))["erp"].startswith("concurrency | 3 override (declared: 2) | 2 | 2 |")

    response = superclient.post(
        limit_url("erp", "set/"), {"action": "set", "n": "0", "back": "limit"}, follow=True
    )
    assert response.redirect_chain == [(limit_url("erp"), 302)]
    assert messages_of(response) == ["Limiter erp set to 0: no job of it starts until it is raised."]
    assert cog.redis.get(cog.key("limit:erp:max")) == b"0"

    response = superclient.post(limit_url("erp", "set/"), {"action": "reset"}, follow=True)
    assert messages_of(response) == ["Limiter erp reset to the limit its code declares."]
    assert cog.redis.exists(cog.key("limit:erp:max")) == 0


@pytest.mark.parametrize("bad", ["", "abc", "-1", "1.5", "3 4", "٣", "9" * 30])
def test_a_limit_that_is_no_whole_number_changes_nothing(cog, superclient, erp, bad):
    response = superclient.post(limit_url("erp", "set/"), {"action": "set", "n": bad}, follow=True)
    assert response.status_code == 200
    assert messages_of(response) == ["Limiter erp: a limit is a whole number >= 0; nothing changed."]
    assert cog.redis.exists(cog.key("limit:erp:max")) == 0


def test_changes_take_a_post_with_the_csrf_token(cog, users, erp):
    client = client_for(users["super"], csrf=True)
    assert client.post(limit_url("erp", "set/"), {"action": "set", "n": "5"}).status_code == 403
    assert client.get(limit_url("erp", "set/"), {"action": "set", "n": "5"}).status_code == 405
    assert cog.redis.exists(cog.key("limit:erp:max")) == 0
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', text(client.get(LIMITS))).group(1)
    form = {"action": "set", "n": "5", "csrfmiddlewaretoken": token}
    assert client.post(limit_url("erp", "set/"), form).status_code == 302
    assert cog.redis.get(cog.key("limit:erp:max")) == b"5"


def test_an_unknown_action_changes_nothing(cog, superclient, erp):
    response = superclient.post(limit_url("erp", "set/"), {"action": "drop", "n": "1"}, follow=True)
    assert messages_of(response) == ["Unknown limit action."]
    assert cog.redis.exists(cog.key("limit:erp:max")) == 0


# -- one limiter ---------------------------------------------------------------------------


def test_a_limiters_page_lists_its_holders_and_waiting_jobs(cog, superclient, erp):
    for i in range(30):
        admit(erp, f"m{i:02d}", "mail")
    body = text(superclient.get(limit_url("erp")))
    assert "<title>Limiter erp |" in body
    holders = re.search(r'<table id="cog-holders">(.*?)</table>', body, re.S).group(1)
    assert re.findall(r'<td class="cog-mono">([^<]+)</td>', holders) == ["j0", IDENTITY, "j1", IDENTITY]
    waiting = re.search(r'<table id="result_list">(.*?)</table>', body, re.S).group(1)
    jids = re.findall(r'<td class="cog-mono">([^<]+)</td>\s*<td>app.sync', waiting)
    assert jids == ["j2", "j3", "j4"] + [f"m{i:02d}" for i in range(22)]
    assert "33 jobs" in body
    second = text(superclient.get(limit_url("erp"), {"p": "2"}))
    assert re.findall(r'<td class="cog-mono">(m\d\d)</td>', second) == [f"m{i:02d}" for i in range(22, 30)]


def test_a_limiter_never_used_reads_as_empty_and_a_bad_name_is_404(cog, superclient):
    body = text(superclient.get(limit_url("not-yet")))
    assert "No job holds a slot." in body and "No job waits for this limiter." in body
    # Bytes that are no UTF-8 in a URL read as U+FFFD: a name like any other.
    assert superclient.get(LIMITS + "%25FF%25ED%25A0%2580/").status_code == 200
    for bad in ("a\nb", "x" * 201, "nul\x00"):
        url = LIMITS + segment(bad).replace("%", "%25") + "/"
        assert superclient.get(url).status_code == 404, bad
        assert superclient.post(url + "set/", {"action": "set", "n": "1"}).status_code == 404


# -- whatever Redis holds -------------------------------------------------------------------


def test_odd_names_are_escaped_and_round_trip_through_urls(cog, superclient):
    for name in (XSS, "a/b", "..", "ü%2F", "acct:7"):
        admit(limits.Concurrency(name, 1), "h-" + name)
    body = text(superclient.get(LIMITS))
    assert "<script>alert" not in body and "&lt;script&gt;" in body
    for name in (XSS, "a/b", "..", "ü%2F", "acct:7"):
        assert f'href="{limit_url(name)}"' in unescape(body) or f'href="{limit_url(name)}"' in body
        page = superclient.get(limit_url(name))
        assert page.status_code == 200 and "h-" + name in unescape(text(page))
        superclient.post(limit_url(name, "set/"), {"action": "set", "n": "4"})
        assert cog.redis.get(cog.key(f"limit:{name}:max")) == b"4", name


def test_garbage_in_redis_is_noted_never_a_500(cog, superclient, erp):
    cog.redis.hset(cog.key("limits"), mapping={"spec": "[" * 50_000, "x\ny": "{}", b"\xed\xa0\x80": "{}"})
    cog.redis.set(cog.key("limit:erp:max"), "lots")
    cog.redis.sadd(cog.key("limit:erp:queues"), b"\xff", "mail")
    cog.redis.set(cog.key("limit:erp:waiting:mail"), "not a list")
    cog.redis.rpush(cog.key("limit:erp:waiting:default"), b"\xff not json")
    for url in (LIMITS, limit_url("erp"), limit_url("spec")):
        response = superclient.get(url)
        assert response.status_code == 200, url
        assert "Malformed in Redis" in text(response), url
    assert "holds &#x27;lots&#x27;, not a whole number" in text(superclient.get(LIMITS))
    assert "unreadable" in text(superclient.get(limit_url("erp")))

    # A key of the wrong type where the wake reads: said on the page, not a 500.
    cog.redis.delete(cog.key("limit:erp:queues"))
    cog.redis.set(cog.key("limit:erp:queues"), "not a set")
    response = superclient.post(limit_url("erp", "set/"), {"action": "set", "n": "3"}, follow=True)
    assert response.status_code == 200
    [message] = messages_of(response)
    assert (
        message.startswith("Limiter erp: could not let a limiter's waiting jobs in")
        and "WRONGTYPE" in message
    )

    cog.redis.delete(cog.key("limits"))
    cog.redis.set(cog.key("limits"), "not a hash")
    response = superclient.get(LIMITS)
    assert response.status_code == 200 and "is not a hash: no limiter is listed" in text(response)


@pytest.mark.parametrize("page", ["", "erp/", "erp/?p=3"])
def test_every_limits_page_answers_503_inside_the_admin_when_redis_is_down(cog, own_redis, superclient, page):
    server = own_redis()
    server.stop()
    cog.configure(REDIS_URL=f"redis://:s3cret-pw@127.0.0.1:{server.port}/0")
    response = superclient.get(LIMITS + page)
    assert response.status_code == 503
    body = text(response)
    assert "Redis is unreachable" in body and f"redis://:***@127.0.0.1:{server.port}/0" in body
    assert "s3cret-pw" not in body
    response = superclient.post(limit_url("erp", "set/"), {"action": "set", "n": "3"})
    assert response.status_code == 503 and "Redis is unreachable" in text(response)


# -- in a real browser ----------------------------------------------------------------------


def test_the_limits_page_in_a_real_browser(cog, live_server, transactional_db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # a fast login
    User.objects.create_superuser("root", "root@example.com", PASSWORD)
    cog.configure(ENQUEUE_ON_COMMIT=False)
    erp = limits.Concurrency("erp", 2)
    for i in range(6):
        admit(erp, f"erp{i:02d}aa11bb22cc33", "default" if i < 5 else "mail")
    stripe = limits.Rate("stripe", 10, per=1)
    for i in range(4):
        admit(stripe, f"pay{i:02d}aa11bb22cc33")
    for account in (17, 42):
        admit(limits.Concurrency(f"account:{account}", 1), f"acct{account}aa11bb22cc33")
    admit(limits.for_queue("reports", 1), "report01aa11bb22cc33", "reports")
    cog.redis.set(cog.key("limit:stripe:max"), 20)

    with chromium() as browser_context:
        page = browser_context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        shots = Shots()
        login(page, live_server.url, LIMITS)
        assert page.locator("#cog-limits tbody tr").count() == 5
        shots.take(page, "limits")

        row = page.locator("#cog-limits tbody tr", has_text="erp")
        row.locator("input[name=n]").fill("4")
        row.locator("button[value=set]").click()
        page.wait_for_selector("ul.messagelist li.success")
        assert "Limiter erp set to 4. 2 waiting jobs let in." in page.locator("ul.messagelist").inner_text()
        erp_row = page.locator("#cog-limits tbody tr", has_text="erp").inner_text()
        assert "4 override (declared: 2)" in erp_row.lower()
        assert cog.redis.get(cog.key("limit:erp:max")) == b"4"
        wait_for(lambda: len(queue_jids(cog)) == 2, 5, "two waiters back on their queue")

        page.click("#cog-limits a:text('erp')")
        page.wait_for_url("**/limits/erp/")
        assert page.locator("#cog-holders tbody tr").count() == 2
        assert page.locator("#result_list tbody tr").count() == 2  # 4 waited, 2 let in
        shots.take(page, "limit")
        assert errors == []

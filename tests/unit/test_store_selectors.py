import pytest

from llmplane.store.selectors import Requirement, Selector, as_selector, parse_selector


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [
        ("", {}, True),
        ("", {"a": "b"}, True),
        ("a=b", {"a": "b"}, True),
        ("a=b", {"a": "c"}, False),
        ("a=b", {}, False),
        ("a==b", {"a": "b"}, True),
        ("a!=b", {"a": "b"}, False),
        ("a!=b", {"a": "c"}, True),
        ("a!=b", {}, True),
        ("e", {"e": ""}, True),
        ("e", {}, False),
        ("!f", {}, True),
        ("!f", {"f": "x"}, False),
        ("g in (x,y)", {"g": "y"}, True),
        ("g in (x,y)", {"g": "z"}, False),
        ("g in (x,y)", {}, False),
        ("h notin (z)", {"h": "z"}, False),
        ("h notin (z)", {"h": "q"}, True),
        ("h notin (z)", {}, True),
        ("a=", {"a": ""}, True),
        ("a=", {"a": "x"}, False),
        ("n>3", {"n": "4"}, True),
        ("n>3", {"n": "3"}, False),
        ("n<3", {"n": "x"}, False),
        ("llmaz.io/model-name=qwen", {"llmaz.io/model-name": "qwen"}, True),
        (
            "a=b,c!=d,e,!f,g in (x,y),h notin (z)",
            {"a": "b", "c": "x", "e": "1", "g": "x", "h": "y"},
            True,
        ),
        (
            "a=b,c!=d,e,!f,g in (x,y),h notin (z)",
            {"a": "b", "c": "x", "e": "1", "f": "1", "g": "x"},
            False,
        ),
        ("  a = b ,  g  in ( x , y )  ", {"a": "b", "g": "y"}, True),
    ],
)
def test_matches(text, labels, expected):
    assert parse_selector(text).matches(labels) is expected


def test_parsed_structure_and_round_trip():
    sel = parse_selector("a=b,c!=d,e,!f,g in (x,y),h notin (z)")
    assert sel.requirements == (
        Requirement("a", "=", ("b",)),
        Requirement("c", "!=", ("d",)),
        Requirement("e", "exists"),
        Requirement("f", "!"),
        Requirement("g", "in", ("x", "y")),
        Requirement("h", "notin", ("z",)),
    )
    assert str(sel) == "a=b,c!=d,e,!f,g in (x,y),h notin (z)"
    assert parse_selector(str(sel)) == sel


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("a=b,", "expected a label key"),
        (",a", "expected a label key"),
        ("a b", "expected '=', '==', '!=', 'in' or 'notin'"),
        ("a in x", "expected '('"),
        ("a in (x", "expected ',' or ')'"),
        ("a in ()", "must not be empty"),
        ("a=b c", "expected ',' between requirements"),
        ("a=(", "expected a label value"),
        ("!", "expected a label key"),
        ("a>x", "expected an integer"),
        ("-a=b", "label key '-a' is invalid"),
        ("a=b-", "label value 'b-' is invalid"),
        ("Bad_/x=1", "invalid prefix"),
        ("a=" + "v" * 64, "is invalid"),
    ],
)
def test_errors_are_clear(text, fragment):
    with pytest.raises(ValueError) as err:
        parse_selector(text)
    message = str(err.value)
    assert message.startswith("invalid label selector")
    assert fragment in message


def test_error_names_position():
    with pytest.raises(ValueError, match="found '\\(' at position 4"):
        parse_selector("a=b,(")


def test_mapping_forms():
    assert as_selector(None) == Selector()
    assert as_selector({"a": "b"}).matches({"a": "b", "c": "d"})
    assert not as_selector({"a": "b"}).matches({"a": "c"})
    label_selector = {
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a", "b"]},
            {"key": "spot", "operator": "DoesNotExist"},
        ],
    }
    sel = as_selector(label_selector)
    assert sel.matches({"app": "web", "zone": "a"})
    assert not sel.matches({"app": "web", "zone": "a", "spot": "1"})
    assert not sel.matches({"app": "web", "zone": "c"})
    with pytest.raises(ValueError, match="operator must be one of"):
        as_selector({"matchExpressions": [{"key": "a", "operator": "Nope"}]})
    with pytest.raises(ValueError, match="must be non-empty"):
        as_selector({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]})
    with pytest.raises(TypeError):
        as_selector(42)  # type: ignore[arg-type]

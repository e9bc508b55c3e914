"""The compression flag: parsing, validation, precedence."""
import pytest

from hvdsketch import spec
from hvdsketch.compress import REGISTRY, create
from hvdsketch.spec import Spec, SpecError


def test_parse_and_render_round_trip():
    s = Spec.parse(" Sketch : rows=3 , error=0.5 ")
    assert s == Spec("sketch", {"rows": "3", "error": "0.5"})
    assert str(s) == "sketch:error=0.5,rows=3"
    assert Spec.parse(str(s)) == s
    assert str(Spec.parse("none")) == "none"


def test_options_are_converted_by_field_type():
    sketch = create("sketch:rows=3,error=0.25,ratio=none")
    assert sketch.rows == 3 and sketch.error == 0.25 and sketch.ratio is None
    assert create("sketch", rows=5).rows == 5
    assert create(str(sketch)) == sketch


@pytest.mark.parametrize("flag, message", [
    ("sketchy", "unknown compressor 'sketchy'; valid: .*sketch"),
    ("sketch:colz=3", r"unknown option\(s\) colz for 'sketch'; valid: bitmap, block, density, error"),
    ("sketch:rows=three", "'three' is not a valid int"),
    ("sketch:rows=0", "rows must be >= 1"),
    ("sketch:rows", "expected key=value"),
    ("sketch:rows=1,rows=2", "given twice"),
    ("", "non-empty string"),
    ("fp16:dtype=int8", "float16 or bfloat16"),
])
def test_bad_flags_raise_clear_errors(flag, message):
    with pytest.raises(SpecError, match=message):
        create(flag)


def test_keyword_options_are_validated():
    with pytest.raises(SpecError, match="unknown option"):
        create("sketch", colz=3)
    with pytest.raises(SpecError, match="either in the spec"):
        create("sketch:rows=3", rows=3)


def test_every_registered_compressor_builds_with_defaults():
    for name in REGISTRY:
        assert create(name).name == name


def test_precedence_argument_cli_env_config(monkeypatch):
    config = {"compression": "fp16"}
    monkeypatch.setenv(spec.ENV_VAR, "sketch:rows=2")
    assert spec.resolve("none", "sketch", config) == "none"
    assert spec.resolve(None, "sketch", config) == "sketch"
    assert spec.resolve(None, None, config) == "sketch:rows=2"
    monkeypatch.delenv(spec.ENV_VAR)
    assert spec.resolve(None, None, config) == "fp16"
    assert spec.resolve(None, None, None) == "none"


def test_canonical_text_is_option_order_free_and_its_digest_fits_its_bits():
    from hvdsketch.digests import digest

    a, b = Spec.parse("sketch:rows=3,error=0.5"), Spec.parse("sketch:error=0.5,rows=3")
    assert str(a) == str(b) and digest(str(a)) == digest(str(b)) != digest(str(Spec.parse("sketch:rows=4")))
    assert all(0 <= digest(f"t{i}", bits) < 2**bits for i in range(50) for bits in (21, 24, 40, 62))
    assert len({digest(f"t{i}", 21) for i in range(50)}) > 45

from medray.text import normalize


def test_nfc_cedilla_and_whitespace():
    decomposed = "s\u0327tefan"  # s + combining cedilla
    assert normalize(decomposed) == "ștefan"
    assert normalize("ţară Ş Ţ ş") == "țară Ș Ț ș"
    assert normalize("  tumoră\r\nmamară \t stângă  ") == "tumoră mamară stângă"


def test_line_breaks_never_glue_words_by_default():
    assert normalize("carcinom\nductal") == "carcinom ductal"


def test_medqaro_compat_reproduces_reference_newline_deletion():
    raw = " carcinom\r\nductal\ninvaziv ş "
    reference = str(raw).strip().replace("\n", "").replace("\r", "")
    assert normalize(raw, compat="medqaro") == reference == "carcinomductalinvaziv ş"


def test_unknown_compat_mode_is_rejected():
    import pytest

    with pytest.raises(ValueError, match="compat"):
        normalize("x", compat="squad")

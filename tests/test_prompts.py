import pytest

from medray.prompts.text import (
    europemedqa_prompt,
    medqaro_prompt,
    medqaro_prompt_parts,
    medqaro_target,
    robiology_prompt,
)


def test_medqaro_reference_strings():
    q, e = "Care este stadiul?", "Pacienta 54 ani."
    assert medqaro_prompt(q, e) == f"Intrebare: {q} Context: {e} Raspuns:"
    assert medqaro_prompt(q, e, "eqa") == f"Context: {e} Intrebare: {q} Raspuns:"
    target = medqaro_target(medqaro_prompt(q, e), "IIA")
    assert target == f"Intrebare: {q} Context: {e} Raspuns: IIA"


@pytest.mark.parametrize("fmt", ["qea", "eqa"])
def test_prompt_parts_reassemble_the_prompt(fmt):
    before, after = medqaro_prompt_parts("Q?", fmt)
    assert before + "EPICRIZA" + after == medqaro_prompt("Q?", "EPICRIZA", fmt)


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="qea"):
        medqaro_prompt("q", "e", "aqe")


def test_robiology_user_prompt_and_shots():
    opts = [{"label": c, "text": t} for c, t in zip("ABCD", ["a", "b", "c", "d"], strict=True)]
    chat = robiology_prompt("Celula procariotă:", opts, "single")
    assert chat.system is None
    assert chat.user.startswith("Celula procariotă:\nA. a\nB. b\nC. c\nD. d\n\n")
    assert chat.user.endswith("The letter of the right answer is:")
    shot = {"question": "Q1", "options": opts, "answer": ["B"]}
    chat3 = robiology_prompt("Q", opts, "single", [shot, shot, shot])
    assert chat3.system.count("# Answer: B") == 3 and chat3.system.count("\n—\n") == 2
    with pytest.raises(ValueError, match="shots"):
        robiology_prompt("Q", opts, "single", [shot, shot])


def test_group_shot_explanation_follows_the_code_table():
    stmts = [{"label": str(i), "text": f"s{i}"} for i in range(1, 5)]
    chat = robiology_prompt("Q", stmts, "group", [{"question": "G", "options": stmts,
                                                    "answer": ["B"]}])
    assert "# Explanation: 1,3 are correct; 2,4 are not\n# Answer: B" in chat.system
    assert "If only options 1,3 are correct, the answer must be B." in chat.user


def test_europemedqa_strict_prompt():
    opts = [{"label": c, "text": c.lower()} for c in "ABCDE"]
    single = europemedqa_prompt("IT0001", "Domanda?", opts)
    assert "IT0001" in single.user and "E. e" in single.user
    assert "Exactly one option" in single.system
    multi = europemedqa_prompt("FR0002", "Question?", opts, multi=True)
    assert "ALL correct options" in multi.system

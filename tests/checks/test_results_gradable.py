"""Which results a person's grade means something for (issue 17: "Send to review" only there)."""

from checks.results import gradable


def test_judged_results_are_gradable_and_facts_are_not() -> None:
    assert gradable("llm_as_judge", {})
    assert gradable("drift", {"method": "judge"}) and gradable(
        "similarity", {"method": "embedding"}
    )
    assert not gradable("drift", {"method": "lexical"})
    assert not gradable("contains", {}) and not gradable("sql", {"method": "judge"})
    assert not gradable("similarity", None)

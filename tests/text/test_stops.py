from __future__ import annotations

from trioserve.text.stops import check_stop_strings, hold_back


def test_earliest_ending_stop_wins_then_list_order():
    # "bc" ends at 3, "abcd" at 4: "bc" wins although listed second
    assert check_stop_strings("xabcd", 4, ["abcd", "bc"], False) == ("bc", 2)
    assert check_stop_strings("xab", 2, ["ab", "b"], False) == ("ab", 1)


def test_include_in_output_cuts_after_the_stop_string_or_not_at_all():
    assert check_stop_strings("say STOP now", 12, ["STOP"], True) == ("STOP", 8)
    assert check_stop_strings("say STOP", 8, ["STOP"], True) == ("STOP", -1)


def test_only_text_the_new_characters_could_complete_is_searched():
    # "ab" lies wholly in old text: not matched again
    assert check_stop_strings("ab----", 1, ["ab"], False) is None
    # a stop string straddling old and new text is found
    assert check_stop_strings("xxa" + "b", 1, ["ab"], False) == ("ab", 2)


def test_hold_back_is_longest_stop_minus_one_unless_included():
    assert hold_back(["a", "abcd"], False) == 3
    assert hold_back(["abcd"], True) == 0
    assert hold_back([], False) == 0

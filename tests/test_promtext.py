from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from guardian.sources import promtext


def test_every_sample_of_the_vllm_page_matches_prometheus_clients_parser(vllm_page: str) -> None:
    ours = {
        (name, tuple(sorted(labels.items()))): value
        for name, entries in promtext.parse(vllm_page).samples.items()
        for labels, value in entries
    }
    theirs = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(vllm_page)
        for s in family.samples
    }
    assert ours == theirs
    assert len(ours) == 482


def test_warm_parser_returns_the_same_page_as_a_cold_one(vllm_page: str) -> None:
    parser = promtext.Parser()
    first = parser.parse(vllm_page)
    second = parser.parse(vllm_page.replace("} 12.0\n", "} 13.0\n"))
    assert first.samples.keys() == second.samples.keys()
    assert second.get("vllm:num_requests_running")[0][1] == 13.0
    assert first.get("vllm:num_requests_running")[0][1] == 12.0


def test_types_are_read_from_type_lines(vllm_page: str) -> None:
    page = promtext.parse(vllm_page)
    assert page.family_type("vllm:e2e_request_latency_seconds_bucket") == "histogram"
    assert page.family_type("vllm:num_preemptions_total") == "counter"
    assert page.family_type("vllm:kv_cache_usage_perc") == "gauge"


def test_page_cut_mid_line_is_refused_as_truncated(vllm_page: str) -> None:
    with pytest.raises(promtext.ParseError, match="truncated"):
        promtext.parse(vllm_page[: len(vllm_page) // 2])


def test_html_error_page_is_refused_with_its_line_number() -> None:
    with pytest.raises(promtext.ParseError) as info:
        promtext.parse("# HELP x y\nx 1\n<html><body>502 Bad Gateway</body></html>\n")
    assert info.value.line == 3


@pytest.mark.parametrize(
    "line",
    [
        'x{a="1" 2',  # no closing brace
        "x{a=1} 2",  # unquoted value
        'x{a="1"} two',  # value not a number
        'x{a="1"}',  # no value
        'x{a="1"} 1 2 3',  # too many fields
        "9x 1",  # invalid name
        "\x00\x01\x02 1",
    ],
)
def test_malformed_sample_lines_are_refused(line: str) -> None:
    with pytest.raises(promtext.ParseError):
        promtext.parse(line + "\n")


def test_empty_page_is_refused() -> None:
    with pytest.raises(promtext.ParseError, match="empty"):
        promtext.parse("\n\n")


def test_escaped_label_values_are_decoded() -> None:
    page = promtext.parse('x{path="C:\\\\tmp",msg="say \\"hi\\"\\n"} 1\n')
    assert page.get("x")[0][0] == {"path": "C:\\tmp", "msg": 'say "hi"\n'}


def test_timestamps_whitespace_and_special_values_are_accepted() -> None:
    page = promtext.parse('a 1 1700000000000\nb{ x = "1" , } NaN\nc +Inf\nd -1.5e3\r\n')
    assert page.get("a")[0][1] == 1
    assert page.get("b")[0][0] == {"x": "1"}
    assert math.isnan(page.get("b")[0][1])
    assert page.get("c")[0][1] == math.inf
    assert page.get("d")[0][1] == -1500


def test_openmetrics_eof_ends_the_page() -> None:
    page = promtext.parse("a 1\n# EOF\n")
    assert page.get("a")[0][1] == 1


def test_family_filter_reads_only_the_wanted_families(vllm_page: str) -> None:
    page = promtext.Parser().parse(vllm_page, frozenset({"vllm:kv_cache_usage_perc", "vllm:e2e_request_latency_seconds"}))
    assert set(page.samples) == {
        "vllm:kv_cache_usage_perc",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_sum",
    }
    assert page.get("vllm:kv_cache_usage_perc")[0][1] == 0.4375
    assert page.family_type("vllm:e2e_request_latency_seconds_bucket") == "histogram"


def test_family_filter_refuses_garbage_in_a_wanted_family_with_the_right_line() -> None:
    text = "# HELP a A\n# TYPE a gauge\na 1\n# HELP b B\n# TYPE b gauge\nb{oops 2\n"
    with pytest.raises(promtext.ParseError) as info:
        promtext.Parser().parse(text, frozenset({"b"}))
    assert info.value.line == 6
    # the same line in a family nobody asked for is not read at all
    assert promtext.Parser().parse(text, frozenset({"a"})).get("a")[0][1] == 1


def _pages(vllm_page: str, seed: int) -> list[str]:
    """The page as a target serves it poll after poll: values that grow (longer and shorter), a series that
    appears, a family that appears, a garbage line, and the families in another order."""
    import random

    rng = random.Random(seed)
    blocks = vllm_page.split("# HELP ")[1:]
    pages = []
    for poll in range(100):
        out = []
        for block in blocks:
            lines = []
            for line in block.split("\n"):
                if line and not line.startswith(("#", "vllm:cache_config_info")) and "{" in line and rng.random() < 0.5:
                    key, _, value = line.rpartition(" ")
                    line = f"{key} {rng.choice(['0.0', '7.0', '12345.0', '1e+06', str(rng.random())])}"
                lines.append(line)
            out.append("\n".join(lines))
        if poll >= 10:  # a new engine core's series in a wanted family
            out = [b.replace('vllm:num_requests_running{engine="0"', 'vllm:num_requests_running{engine="1"} 3.0\nvllm:num_requests_running{engine="0"')
                   if b.startswith("vllm:num_requests_running ") else b for b in out]  # fmt: skip
        if poll >= 20:  # a family the page did not have
            out.insert(3, "vllm:gpu_cache_usage_perc GPU KV-cache usage.\n# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.5\n")
        if poll >= 90:
            rng.shuffle(out)
        pages.append("".join("# HELP " + b for b in out))
    return pages


def test_a_warm_parser_reads_every_poll_as_a_fresh_one_would(vllm_page: str) -> None:
    """...but a family missing from a target's page is looked for again only every ``ABSENT_RECHECK_PARSES`` parses
    (or after the target was gone): vLLM registers its families at start, and looking costs a scan of the page."""
    from guardian.sources.vllm_page import FAMILIES

    warm = promtext.Parser()
    late = {"vllm:gpu_cache_usage_perc"}  # appears at poll 20
    for i, text in enumerate(_pages(vllm_page, seed=3)):
        ours, fresh = warm.parse(text, FAMILIES), promtext.Parser().parse(text, FAMILIES)
        if 20 <= i < 20 + promtext.ABSENT_RECHECK_PARSES and late - set(ours.samples):
            assert {k: v for k, v in fresh.samples.items() if k not in late} == ours.samples, f"poll {i}"
            continue
        assert ours.samples == fresh.samples and ours.types == fresh.types, f"poll {i}"
    assert late <= set(ours.samples)


def test_a_target_that_was_gone_is_read_afresh(vllm_page: str) -> None:
    from guardian.sources.vllm_page import FAMILIES

    pages = _pages(vllm_page, seed=4)
    warm = promtext.Parser()
    warm.parse(pages[0], FAMILIES)  # gpu_cache_usage_perc is missing here
    warm.forget()  # the scrape failed: the target restarted
    assert warm.parse(pages[25], FAMILIES).samples == promtext.Parser().parse(pages[25], FAMILIES).samples


def test_a_family_between_two_wanted_ones_changing_its_series_is_still_not_read(vllm_page: str) -> None:
    """Wanted families close together are read as one run with what lies between them (vLLM's ``_created`` blocks):
    a change there sends the page through the family-by-family reading once, and nothing unwanted ever reaches the page."""
    wanted = frozenset({"vllm:num_requests_running", "vllm:engine_sleep_state"})  # num_requests_waiting* sit between
    warm = promtext.Parser()
    assert warm.parse(vllm_page, wanted).samples == promtext.Parser().parse(vllm_page, wanted).samples
    block = vllm_page.index("# HELP vllm:num_requests_waiting ")
    line_end = vllm_page.index("\n", vllm_page.index("\nvllm:num_requests_waiting{", block) + 1)
    changed = vllm_page[: line_end + 1] + 'vllm:num_requests_waiting{engine="1",model_name="m"} 7.0\n' + vllm_page[line_end + 1 :]
    for text in (changed, changed, vllm_page):
        page = warm.parse(text, wanted)
        assert page.samples == promtext.Parser().parse(text, wanted).samples
        assert set(page.samples) == {"vllm:num_requests_running", "vllm:engine_sleep_state"}

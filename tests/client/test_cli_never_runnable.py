"""The CLI refuses a job its share can never hold: exit 2 with the server's words."""

from quotas.choices import Strategy
from tests.conftest import make_share


def test_a_never_runnable_submit_exits_2_saying_why(logged_in, vision):
    make_share(vision, "vision-prod", capacity={"a10g": 2}, strategy=Strategy.RESERVE)
    code, _, err = logged_in(
        "submit", "--share", "vision-prod", "--gpus", 3, "--gpu-type", "a10g", "--", "true"
    )
    assert code == 2
    assert "vision-prod is RESERVE with 2 a10g: a 3-GPU job can never start there" in err

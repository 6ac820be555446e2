"""Handing a checkpoint to an attempt never goes through a link (issue 30, finding 10): a job's
`ln /var/tmp/victim $GPUQUOTA_CHECKPOINT_DIR/hl` got the victim's file handed to the job's uid on its
next attempt. Since issue 42 nothing is handed over per attempt (a job's directory has one owner, seen
as each attempt's own through an idmapped mount): what is left is the one-time adoption of a directory
from before, which goes by the same rules. Real processes, a root agent."""

import os
import stat

from gpunodes.agent.identity import checkpoint_owner
from tests.security.agent_helpers import as_root, uid_pool, wait_until

pytestmark = as_root

PROBE = 'cd "$GPUQUOTA_CHECKPOINT_DIR" && {{ cat {name} && echo LEAK:read; echo x >> {name} && echo LEAK:write; }}'


def test_a_hard_link_to_a_file_outside_is_not_handed_to_the_next_attempt(root_runner, reports, root_dir):
    victim_uid = uid_pool().first  # another range's uid: another team's file
    victim = root_dir / "victim"
    victim.write_text("victim-secret")
    os.chown(victim, victim_uid, victim_uid)
    victim.chmod(0o600)
    ckpt = root_runner.checkpoint_root / "job-7"
    ckpt.mkdir(mode=0o700)
    os.link(victim, ckpt / "hl")  # what attempt 1 of the job did (the host allowed the link)

    command = PROBE.format(name="hl") + "; stat -c owner=%u hl"
    root_runner.start(attempt_id=1, number=2, job_id=7, command=[command], use_shell=True)
    wait_until(lambda: reports.finished(1), runner=root_runner, what="the attempt to end")
    out = reports.log_of(1)
    # Its name was taken out when the directory was adopted: an append makes a file of the job's own.
    assert "LEAK:read" not in out, out
    st = victim.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (victim_uid, 0o600)  # not root's either
    assert victim.read_text() == "victim-secret"
    # Taken out of the checkpoint when it was adopted (an "hl" there now is the job's append's).
    assert not (ckpt / "hl").exists() or not (ckpt / "hl").samefile(victim)


def test_links_inside_the_checkpoint_are_handed_over_and_symlinks_never_followed(root_runner, reports):
    ckpt = root_runner.checkpoint_root / "job-7"
    ckpt.mkdir(mode=0o700)
    (ckpt / "step-100.pt").write_text("weights")
    os.link(ckpt / "step-100.pt", ckpt / "latest.pt")  # both names in the tree: the job's own file
    os.symlink("/etc/shadow", ckpt / "shadow")
    command = (
        'cd "$GPUQUOTA_CHECKPOINT_DIR" && cat latest.pt && echo " ok" && '
        "cp latest.pt suid && chmod 4755 suid && { cat shadow && echo LEAK:shadow; true; }"
    )
    root_runner.start(attempt_id=1, number=2, job_id=7, command=[command], use_shell=True)
    wait_until(lambda: reports.finished(1), runner=root_runner, what="the attempt to end")
    out = reports.log_of(1)
    assert "weights ok" in out and "LEAK" not in out, out
    assert os.stat("/etc/shadow").st_uid == 0
    # The tree is its job's owner's, which no process runs as: a set-user-id file it made is never a
    # root one (and its idmapped mount is nosuid).
    owner = checkpoint_owner(7)
    suid = (ckpt / "suid").stat()
    assert suid.st_uid == owner or not suid.st_mode & (stat.S_ISUID | stat.S_ISGID)
    assert suid.st_uid != 0
    assert (ckpt / "latest.pt").stat().st_uid == owner and (ckpt / "latest.pt").stat().st_nlink == 2

//! One atomic write as data: the commands built from typed operations,
//! each filed by the key it writes as it is built.
//!
//! The topology decides how a unit goes out, not the code that builds it:
//! one node renders it into one transaction ([`Unit::append_to`]); a
//! cluster cuts it by slot ([`crate::sink::cluster::split`]) from what
//! is recorded here, without reading command names back. The few writes
//! that span keys say so in their entry (an `UNLINK` of many keys, a
//! move between two sets, a guarded step), so each topology can send
//! them the way it must.

/// One atomic write. Built with [`Unit::cmd`] and its siblings; sent by
/// [`crate::sink::Sink::send`].
#[derive(Debug, Default, Clone)]
pub struct Unit {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
pub(in crate::sink) enum Entry {
    /// A command that writes one key, always its first argument (the
    /// builder puts it there).
    Keyed(redis::Cmd),
    /// `UNLINK` of keys that may live in many slots.
    Unlink(Vec<String>),
    /// A member moved from one set to another: `SMOVE` on one node; on a
    /// cluster, where the sets live in different slots, `SREM` and `SADD`
    /// (the member sits in exactly one of them a moment later).
    Move { from: String, to: String, member: String },
    /// A command that names no key (`PUBLISH`): on a cluster it goes
    /// after every slot's part landed.
    Keyless(redis::Cmd),
    /// Keyed commands whose size guards are all checked before any of
    /// them runs (see [`crate::sink::cluster::WRITE_SCRIPT`]): one write
    /// script on one node; on a cluster each slot's script checks its own.
    Guarded(Vec<redis::Cmd>),
}

impl Unit {
    pub fn new() -> Unit {
        Unit::default()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A command that writes `key`; its other arguments follow on the
    /// command returned.
    pub fn cmd(&mut self, name: &str, key: impl AsRef<[u8]>) -> &mut redis::Cmd {
        self.cmd_with_room(name, key, 0, 0)
    }

    /// [`Unit::cmd`] for a command whose other arguments are known to be
    /// `args` arguments of `bytes` bytes in all: the command is allocated
    /// at its size once, instead of growing as each argument is added (a
    /// detail payload or a chunk of members grew its buffer several times,
    /// about 3% of a rebuild's instructions).
    pub fn cmd_with_room(&mut self, name: &str, key: impl AsRef<[u8]>, args: usize, bytes: usize) -> &mut redis::Cmd {
        self.entries.push(Entry::Keyed(keyed(name, key.as_ref(), args, bytes)));
        match self.entries.last_mut() {
            Some(Entry::Keyed(cmd)) => cmd,
            _ => unreachable!("a keyed command was pushed just above"),
        }
    }

    /// `UNLINK` of `keys` (nothing when there is none).
    pub fn unlink<S: AsRef<str>>(&mut self, keys: &[S]) {
        if !keys.is_empty() {
            self.entries.push(Entry::Unlink(keys.iter().map(|key| key.as_ref().to_owned()).collect()));
        }
    }

    /// `member` moved from set `from` to set `to`.
    pub fn smove(&mut self, from: String, to: String, member: &str) {
        self.entries.push(Entry::Move { from, to, member: member.to_string() });
    }

    pub fn publish(&mut self, channel: &str, message: &str) {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(channel).arg(message);
        self.entries.push(Entry::Keyless(cmd));
    }

    /// Adds `step` as one guarded step: its size guards are checked
    /// before any of its commands runs.
    pub fn guarded(&mut self, step: Step) {
        if !step.commands.is_empty() {
            self.entries.push(Entry::Guarded(step.commands));
        }
    }

    pub(in crate::sink) fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Appends the unit as one node runs it, every reply ignored; the
    /// caller frames it (`MULTI`/`EXEC`, or the fence's frame).
    pub fn append_to(self, pipe: &mut redis::Pipeline) {
        for entry in self.entries {
            let cmd = match entry {
                Entry::Keyed(cmd) | Entry::Keyless(cmd) => cmd,
                Entry::Unlink(keys) => {
                    let mut cmd = redis::cmd("UNLINK");
                    cmd.arg(keys);
                    cmd
                }
                Entry::Move { from, to, member } => {
                    let mut cmd = redis::cmd("SMOVE");
                    cmd.arg(from).arg(to).arg(member);
                    cmd
                }
                Entry::Guarded(commands) => {
                    let args: Vec<Vec<&[u8]>> = commands.iter().map(crate::sink::cluster::cmd_args).collect();
                    crate::sink::cluster::guarded_command(&args)
                }
            };
            pipe.add_command(cmd).ignore();
        }
    }

    /// The unit as one node's plain pipeline (no frame): what the
    /// benchmark replays with `redis-cli --pipe`, and what tests read.
    pub fn into_pipeline(self) -> redis::Pipeline {
        let mut pipe = redis::pipe();
        self.append_to(&mut pipe);
        pipe
    }
}

/// Commands that go as one guarded step of a [`Unit`]: keyed commands
/// only, their size guards among them (see [`Unit::guarded`]).
#[derive(Debug, Default, Clone)]
pub struct Step {
    commands: Vec<redis::Cmd>,
}

impl Step {
    /// A command that writes `key`, as [`Unit::cmd`].
    pub fn cmd(&mut self, name: &str, key: impl AsRef<[u8]>) -> &mut redis::Cmd {
        self.commands.push(keyed(name, key.as_ref(), 0, 0));
        let last = self.commands.len() - 1;
        &mut self.commands[last]
    }
}

/// `name key`, with room for `args` more arguments of `bytes` bytes.
fn keyed(name: &str, key: &[u8], args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(2 + args, name.len() + key.len() + bytes);
    cmd.arg(name).arg(key);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(pipe: &redis::Pipeline) -> Vec<String> {
        pipe.cmd_iter()
            .map(|cmd| {
                crate::sink::cluster::cmd_args(cmd)
                    .iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    /// One node runs what spans keys as one command: `UNLINK` of all the
    /// keys, `SMOVE`, and a guarded step as one write script.
    #[test]
    fn one_node_runs_each_entry_as_one_command() {
        let mut unit = Unit::new();
        unit.cmd("SET", "a").arg("v");
        unit.unlink(&["a".to_string(), "b".to_string()]);
        unit.unlink::<String>(&[]);
        unit.smove("s:active".into(), "s:done".into(), "r1");
        let mut step = Step::default();
        step.cmd(crate::sink::cluster::SIZE_GUARD, "k").arg("LLEN").arg(2);
        step.cmd("RPUSH", "k").arg("x");
        unit.guarded(step);
        unit.guarded(Step::default());
        unit.publish("chan", "m");
        let commands = text(&unit.into_pipeline());
        assert_eq!(commands.len(), 5);
        assert_eq!(commands[..3], ["SET a v", "UNLINK a b", "SMOVE s:active s:done r1"]);
        assert!(commands[3].starts_with("EVAL ") && commands[3].ends_with(" 4 SIZEIS k LLEN 2 3 RPUSH k x"));
        assert_eq!(commands[4], "PUBLISH chan m");
    }
}

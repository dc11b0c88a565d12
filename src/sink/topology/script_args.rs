//! How a unit's commands travel in a write script's `ARGV` (see
//! `cluster::WRITE_SCRIPT`): each command as its argument count and its
//! arguments, except runs of one-member set flips, which go as one block.
//!
//! A category turned active or inactive reaches the `video:categories`
//! set of every member: at 2M videos about a thousand keys a flip, each
//! patched as `SIZEIS key SCARD n`, `SREM key c` (or `SADD`) and
//! `EXPIRE key s`: 13 arguments a key, each made a Lua string by the
//! script and a command argument again. Inside the script that cost
//! Redis about 6 µs a key, measured against 2M sets of two members
//! (`scripts/bench-flip-script.sh`); the same work as a block of `key n
//! s` triples behind one `SREM c` header cost 3.4–3.8 µs. The block keeps the commands' meaning exactly:
//! every key's size is checked before any command runs, then each key
//! gets its `SREM` (an absent member answers `DRIFTED`, as for any
//! guarded key) and its `EXPIRE`, in the order the unit listed them.
//! Only the encoding changes, so the topology's slot cut, its cost
//! bounds and the scripts' `KEYS` all still see the plain commands.

use crate::sink::cluster::SIZE_GUARD;

/// The name the write scripts know a block of set flips by (Redis has
/// no such command): `FLIPS op member` then `key size seconds` per key,
/// `op` being `SADD` or `SREM`.
pub const FLIPS: &str = "FLIPS";

/// Calls `push` with the script arguments of `commands`, in order.
pub fn push_commands<'a>(commands: impl IntoIterator<Item = &'a [&'a [u8]]>, mut push: impl FnMut(&[u8])) {
    let commands: Vec<&[&[u8]]> = commands.into_iter().collect();
    let mut count = itoa::Buffer::new();
    let mut i = 0;
    while i < commands.len() {
        let Some((op, member)) = flip_at(&commands[i..]) else {
            push(count.format(commands[i].len()).as_bytes());
            commands[i].iter().for_each(|arg| push(arg));
            i += 1;
            continue;
        };
        let mut end = i + 3;
        while flip_at(&commands[end..]) == Some((op, member)) {
            end += 3;
        }
        push(count.format(3 + (end - i)).as_bytes());
        push(FLIPS.as_bytes());
        push(op);
        push(member);
        for triple in commands[i..end].chunks(3) {
            // The key, the guard's size, the EXPIRE's seconds.
            push(triple[0][1]);
            push(triple[0][3]);
            push(triple[2][2]);
        }
        i = end;
    }
}

/// The operation and member of the set flip `commands` start with:
/// `SIZEIS k SCARD n`, `SADD|SREM k member` and `EXPIRE k s`, one key.
fn flip_at<'a>(commands: &[&[&'a [u8]]]) -> Option<(&'a [u8], &'a [u8])> {
    let [guard, edit, expire, ..] = commands else { return None };
    let key = guard.get(1)?;
    let is = |cmd: &[&[u8]], name: &[u8], len: usize| cmd.len() == len && cmd[0] == name && cmd[1] == *key;
    let flip = is(guard, SIZE_GUARD.as_bytes(), 4)
        && guard[2] == b"SCARD"
        && (is(edit, b"SADD", 3) || is(edit, b"SREM", 3))
        && is(expire, b"EXPIRE", 3);
    flip.then(|| (edit[0], edit[2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(commands: &[Vec<&str>]) -> Vec<String> {
        let bytes: Vec<Vec<&[u8]>> = commands.iter().map(|c| c.iter().map(|a| a.as_bytes()).collect()).collect();
        let mut out = Vec::new();
        push_commands(bytes.iter().map(Vec::as_slice), |a| out.push(String::from_utf8_lossy(a).into_owned()));
        out
    }

    fn flip<'a>(key: &'a str, size: &'a str, op: &'a str, member: &'a str, seconds: &'a str) -> [Vec<&'a str>; 3] {
        [vec!["SIZEIS", key, "SCARD", size], vec![op, key, member], vec!["EXPIRE", key, seconds]]
    }

    #[test]
    fn plain_commands_go_as_their_count_and_arguments() {
        let commands = [vec!["SET", "a", "v"], vec!["SIZEIS", "l", "LLEN", "2"], vec!["RPUSH", "l", "x"]];
        assert_eq!(encoded(&commands), ["3", "SET", "a", "v", "4", "SIZEIS", "l", "LLEN", "2", "3", "RPUSH", "l", "x"]);
    }

    /// Consecutive flips of one member the same way share a block; a
    /// flip of another member or the other way starts a new one.
    #[test]
    fn runs_of_one_member_flips_go_as_one_block() {
        let mut commands = Vec::new();
        commands.extend(flip("v1", "2", "SREM", "c1", "90"));
        commands.extend(flip("v2", "1", "SREM", "c1", "91"));
        commands.extend(flip("v3", "3", "SADD", "c1", "92"));
        commands.extend(flip("v4", "3", "SADD", "c2", "93"));
        commands.push(vec!["SET", "a", "v"]);
        assert_eq!(
            encoded(&commands),
            [
                "9", "FLIPS", "SREM", "c1", "v1", "2", "90", "v2", "1", "91", //
                "6", "FLIPS", "SADD", "c1", "v3", "3", "92", //
                "6", "FLIPS", "SADD", "c2", "v4", "3", "93", //
                "3", "SET", "a", "v",
            ]
        );
    }

    /// A patch with more than one edit, a guard by another size, commands
    /// of different keys or a cut-short flip go command by command.
    #[test]
    fn anything_else_goes_command_by_command() {
        let plain = |commands: &[Vec<&str>]| {
            let expected: Vec<String> = commands
                .iter()
                .flat_map(|c| std::iter::once(c.len().to_string()).chain(c.iter().map(|a| a.to_string())))
                .collect();
            assert_eq!(encoded(commands), expected, "{commands:?}");
        };
        let guard = vec!["SIZEIS", "v1", "SCARD", "2"];
        let expire = vec!["EXPIRE", "v1", "5"];
        plain(&[guard.clone(), vec!["SADD", "v1", "c3"], vec!["SREM", "v1", "c1"], expire.clone()]);
        plain(&[guard.clone(), vec!["SADD", "v1", "c3", "c4"], expire.clone()]);
        plain(&[vec!["SIZEIS", "v1", "LLEN", "2"], vec!["SADD", "v1", "c3"], expire.clone()]);
        plain(&[guard.clone(), vec!["SADD", "v2", "c3"], expire.clone()]);
        plain(&[guard.clone(), vec!["ZREM", "v1", "c3"], expire.clone()]);
        plain(&[guard, vec!["SADD", "v1", "c3"]]);
    }
}

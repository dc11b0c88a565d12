//! The Redis edge on a cluster: scripted writes per master (per slot when
//! a master refuses), the epoch's copies, per-master commands and scans
//! that follow the slot map.

use crate::sink::cluster::{self, Layout, SlotPart};
use crate::sink::conn::{Seam, Topology};
use crate::sink::router::Router;
use crate::sink::script::{Named, Script, is_noscript};
use crate::sink::topology::script_args::push_commands;
use crate::sink::{Fence, RedisConn, Sink, SinkError, Unit, is_retriable};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::time::Duration;

/// Slot parts (or epoch copies) sent one by one at once, after the
/// per-master pipelines refused them.
const PARTS_IN_FLIGHT: usize = 256;
/// Epoch copies raised by one script: about a millisecond of a master's
/// time, which its readers wait behind.
const COPIES_PER_SCRIPT: usize = 256;
/// How long a scan waits for moving slots to settle before it gives up.
const SETTLE_WAIT: Duration = Duration::from_secs(120);
const SETTLE_PAUSE: Duration = Duration::from_millis(250);
/// Rounds of raising the epoch copies per master while a master does not
/// answer, and the pause between them: about the default
/// `cluster-node-timeout` (15 s), after which the cluster has flagged a
/// dead master failed and its slots count as uncovered.
const ARM_ROUNDS: u32 = 16;
const ARM_PAUSE: Duration = Duration::from_secs(1);

/// A call of one of the cluster's scripts by hash, kept to be sent again
/// as the writer retries.
struct ScriptCall {
    by_hash: redis::Cmd,
    script: &'static Script,
}

impl ScriptCall {
    fn new(script: &'static Script, keys: &[&[u8]], args: &[&[u8]]) -> ScriptCall {
        ScriptCall { by_hash: script.with(keys, args), script }
    }

    async fn run(&self, conn: &mut RedisConn) -> redis::RedisResult<()> {
        self.script.run::<redis::Value>(&self.by_hash, conn).await.map(drop)
    }
}

/// How a slot part's script failed, as the writer must act on it.
enum PartError {
    /// A newer writer raised this slot's epoch copy.
    Fenced,
    /// The copy is missing or older than this writer's epoch.
    EpochLow,
    Redis(redis::RedisError),
}

fn classify(err: redis::RedisError) -> PartError {
    match err.code() {
        Some("FENCED") => PartError::Fenced,
        Some("EPOCHLOW") => PartError::EpochLow,
        _ => PartError::Redis(err),
    }
}

/// A key-batch of a scan, or word that the pass so far is void.
pub enum Scanned {
    Restart,
    Keys(Vec<Vec<u8>>),
}

fn parse<T: redis::FromRedisValue>(value: redis::Value) -> Result<T, SinkError> {
    redis::from_redis_value(value).map_err(|e| SinkError::Scan { attempts: 1, source: e.into() })
}

fn read_err(source: redis::RedisError) -> SinkError {
    SinkError::Scan { attempts: 1, source }
}

/// Refuses a status prefix with a brace: it would give the epoch key
/// and its per-slot copies a hash tag of its own, moving them out of the
/// slots fencing relies on.
pub(in crate::sink) fn check_cluster(settings: &crate::config::RedisSettings) -> Result<(), SinkError> {
    if !settings.status_prefix.contains(['{', '}']) {
        return Ok(());
    }
    Err(SinkError::Cluster(format!(
        "CACHEWRIGHT_STATUS_PREFIX={} holds a brace, which on a Redis Cluster would move the writer \
         lease's epoch keys into the wrong slots: use a prefix without {{ or }}",
        settings.status_prefix
    )))
}

/// A Redis Cluster through [`Router`], which sends each command to the
/// master of its key's slot and follows the cluster while slots move.
/// Writes are cut by slot into scripts, fenced by the epoch's copy in
/// every slot; scans, INFO and `run_id` ask every master.
impl Topology for Router {
    fn name(&self) -> &'static str {
        "cluster"
    }

    fn request<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(Router::request(self, cmd))
    }

    /// A plain (non-atomic) pipeline over keys of many slots cannot go to
    /// one node: its commands are sent each to its key's master, slots
    /// concurrently and one slot's commands in order, and the replies kept
    /// in the pipeline's order. Atomic units go through [`Topology::send`],
    /// which cuts them by slot.
    fn pipeline<'a>(&'a self, pipe: &'a Pipeline, offset: usize, count: usize) -> RedisFuture<'a, Vec<Value>> {
        if offset == 0 && count == pipe.len() {
            return Box::pin(spread(self, pipe));
        }
        Box::pin(async {
            Err((redis::ErrorKind::Client, "an atomic pipeline over a cluster must be cut by slot (Sink::send does)")
                .into())
        })
    }

    fn masters(&self) -> Vec<String> {
        Router::masters(self)
    }

    fn on_node<'a>(&'a self, addr: &'a str, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(Router::on_node(self, addr, cmd))
    }

    fn pipeline_on_node<'a>(&'a self, addr: &'a str, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(Router::pipeline_on_node(self, addr, pipe))
    }

    fn owner(&self, slot: u16) -> Option<String> {
        Router::owner(self, Some(slot))
    }

    fn covers(&self, key: &[u8]) -> bool {
        Router::owner(self, Some(cluster::slot(key))).is_some()
    }

    fn uncovered(&self) -> Vec<(u16, u16)> {
        Router::uncovered(self)
    }

    fn refresh_masters(&self) -> BoxFuture<'_, redis::RedisResult<()>> {
        Box::pin(Router::refresh(self))
    }

    fn unit_cost(&self, batch_cost: usize) -> usize {
        batch_cost / cluster::SCRIPT_BUDGET_DIVISOR
    }

    fn spans_slots(&self) -> bool {
        false
    }

    fn send<'a>(&'a self, sink: &'a Sink, unit: Unit) -> Seam<'a, ()> {
        Box::pin(async move { sink.send_cluster(self, &unit).await })
    }

    fn arm<'a>(&'a self, sink: &'a Sink, fence: &'a Fence) -> Seam<'a, ()> {
        Box::pin(sink.raise_epoch_copies(self, fence))
    }

    fn scan<'a>(&'a self, sink: &'a Sink, glob: &'a str, found: tokio::sync::mpsc::Sender<Scanned>) -> Seam<'a, ()> {
        Box::pin(sink.scan_masters(self, glob, found))
    }

    fn infos<'a>(&'a self, sink: &'a Sink, sections: &'a [&'a str]) -> Seam<'a, Vec<(String, String)>> {
        Box::pin(sink.info_of_masters(self, sections))
    }

    /// Every live master's address and `run_id`, in address order
    /// (`addr=run_id,…`; the watcher checks this before every batch, see
    /// [`crate::sink::same_servers`]).
    fn run_id<'a>(&'a self, sink: &'a Sink) -> Seam<'a, String> {
        Box::pin(async move {
            let infos = sink.info_of_masters(self, &["server"]).await?;
            Ok(infos
                .iter()
                .map(|(addr, info)| format!("{addr}={}", crate::sink::info_value(info, "run_id").unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(","))
        })
    }
}

/// Reads in flight at once when a plain pipeline is spread over a
/// cluster's masters.
const SPREAD: usize = 64;

async fn spread(router: &Router, pipeline: &Pipeline) -> redis::RedisResult<Vec<Value>> {
    // Commands on one slot keep their order (a `DEL` then a `SET` of one
    // key must not swap); slots run concurrently. Owned commands: a
    // closure over borrowed ones trips the compiler's lifetime check.
    let mut by_slot: indexmap::IndexMap<Option<u16>, Vec<(usize, Cmd)>> = indexmap::IndexMap::new();
    for (i, cmd) in pipeline.cmd_iter().enumerate() {
        by_slot.entry(crate::sink::router::command_slot(cmd)).or_default().push((i, cmd.clone()));
    }
    let answered: Vec<Vec<(usize, Value)>> = futures::stream::iter(by_slot.into_values())
        .map(move |commands| async move {
            let mut replies = Vec::with_capacity(commands.len());
            for (i, cmd) in commands {
                replies.push((i, router.request(&cmd).await?));
            }
            Ok::<_, redis::RedisError>(replies)
        })
        .buffer_unordered(SPREAD)
        .try_collect()
        .await?;
    let mut replies = vec![Value::Nil; pipeline.len()];
    for (i, value) in answered.into_iter().flatten() {
        replies[i] = value;
    }
    Ok(replies)
}

impl Sink {
    /// Sends each master its items' commands as one pipeline, the masters
    /// in parallel. Each item comes back with its reply, or with `None`
    /// when the master refused it (an error reply: a moved slot,
    /// `TRYAGAIN`, a lost epoch copy, a fence) or it was lost with a
    /// connection; the caller then sends it again on its own, following
    /// the cluster. `command` names its script as told: by hash first,
    /// and again by text for the calls a master answered `NOSCRIPT`.
    ///
    /// The flag says whether any pipeline failed in a way that leaves its
    /// fate unknown (timed out, or its connection broke after sending):
    /// it may still run later.
    async fn per_master_pipelines<T>(
        &self,
        router: &Router,
        by_master: Vec<(String, Vec<T>)>,
        command: impl Fn(&T, Named) -> redis::Cmd,
    ) -> (Vec<(T, Option<redis::Value>)>, bool) {
        let command = &command;
        let pipe = |items: &mut dyn Iterator<Item = &T>, named| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for item in items {
                pipe.add_command(command(item, named));
            }
            pipe
        };
        let pipe = &pipe;
        let sent = by_master.into_iter().map(|(addr, items)| async move {
            let mut replies = match router.pipeline_on_node(&addr, &pipe(&mut items.iter(), Named::ByHash)).await {
                Ok(replies) if replies.len() == items.len() => replies,
                Ok(_) => return (items.into_iter().map(|item| (item, None)).collect(), true),
                Err(err) => {
                    return (items.into_iter().map(|item| (item, None)).collect(), crate::sink::is_ambiguous(&err));
                }
            };
            // A master that does not hold the script ran none of these
            // calls: they go again by text, which stores it there. Calls
            // still unanswered go on as refused.
            let missing: Vec<usize> = (0..replies.len()).filter(|&i| is_noscript(&replies[i])).collect();
            let mut ambiguous = false;
            if !missing.is_empty() {
                let again = pipe(&mut missing.iter().map(|&i| &items[i]), Named::ByText);
                match router.pipeline_on_node(&addr, &again).await {
                    Ok(answers) if answers.len() == missing.len() => {
                        missing.into_iter().zip(answers).for_each(|(i, answer)| replies[i] = answer);
                    }
                    Ok(_) => ambiguous = true,
                    Err(err) => ambiguous = crate::sink::is_ambiguous(&err),
                }
            }
            let answered = items.into_iter().zip(replies).map(|(item, reply)| match reply {
                redis::Value::ServerError(err) => {
                    tracing::debug!(node = %addr, error = ?err, "a master refused a write; sent again on its own");
                    (item, None)
                }
                reply => (item, Some(reply)),
            });
            (answered.collect::<Vec<_>>(), ambiguous)
        });
        let mut ambiguous = false;
        let mut out = Vec::new();
        for (items, unknown) in futures::future::join_all(sent).await {
            out.extend(items);
            ambiguous |= unknown;
        }
        (out, ambiguous)
    }

    /// Writes an atomic unit on a cluster: cut by slot, and each
    /// master's slots of it written by one script, all or nothing (fenced
    /// by the slots' epoch copies when the sink is), the masters in
    /// parallel. A master that refuses (a slot moved or moving, a copy to
    /// restore, a fence) gets its parts again one slot at a time, each
    /// following the cluster. Commands without a key (`PUBLISH`) go last.
    pub(in crate::sink) async fn send_cluster(
        &self,
        router: &Router,
        unit: &crate::sink::Unit,
    ) -> Result<(), SinkError> {
        let split = cluster::split(unit);
        if let Some(fence) = &self.fence
            && !fence.is_valid()
        {
            return Err(SinkError::LeaseLost);
        }
        let (by_master, mut left) = router.by_master(split.parts, |part| part.slot);
        let epoch = self.fence.as_ref().map(Fence::epoch);
        let groups = by_master.into_iter().map(|(addr, parts)| (addr, cluster::bounded_groups(parts))).collect();
        let (sent, ambiguous) = self
            .per_master_pipelines(router, groups, |parts, named| {
                cluster::group_command(&self.status_prefix, epoch, parts, named)
            })
            .await;
        for (parts, reply) in sent {
            if reply.is_none() {
                left.extend(parts);
            }
        }
        // A group that may still land later must not land after the parts
        // sent again below (or newer batches): the writer raises its epoch
        // first, so the late copy is refused.
        if ambiguous && let (Some(fence), Some(epoch)) = (&self.fence, epoch) {
            self.raise_own_epoch(fence, epoch).await?;
        }
        // The futures are made by an iterator, not a stream's `map`: a
        // closure over borrowed parts trips the compiler's `Send` check.
        let sends: Vec<_> = left.into_iter().map(|part| self.send_part(part)).collect();
        futures::stream::iter(sends).buffer_unordered(PARTS_IN_FLIGHT).try_collect::<Vec<()>>().await?;
        for args in split.keyless {
            let mut cmd = redis::cmd(&String::from_utf8_lossy(args[0]));
            for arg in &args[1..] {
                cmd.arg(*arg);
            }
            let conn = &self.conn;
            self.retry
                .run(|| {
                    let (cmd, mut conn) = (&cmd, conn.clone());
                    async move { cmd.query_async::<redis::Value>(&mut conn).await.map(drop) }
                })
                .await
                .map_err(|(attempts, source)| SinkError::Write { attempts, source })?;
        }
        Ok(())
    }

    /// The script call of one slot part, fenced by the slot's epoch copy
    /// when the sink is.
    fn part_call(&self, part: &SlotPart<'_>, epoch: Option<u64>) -> ScriptCall {
        let copy = epoch.map(|_| crate::keys::status::epoch_copy_key(&self.status_prefix, part.slot));
        let epoch = epoch.map(|e| e.to_string()).unwrap_or_default();
        let probe = crate::keys::status::probe_key(&self.status_prefix, part.slot);
        let mut keys: Vec<&[u8]> = copy.iter().map(|c| c.as_bytes()).collect();
        keys.push(probe.as_bytes());
        keys.extend(part.keys());
        let mut owned: Vec<Vec<u8>> = vec![epoch.into_bytes()];
        push_commands(part.commands.iter().map(Vec::as_slice), |arg| owned.push(arg.to_vec()));
        let args: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        ScriptCall::new(&cluster::WRITE, &keys, &args)
    }

    /// One part on its own, following the cluster: redirections, retries,
    /// a restored epoch copy, or a fence that ends the writer. After a
    /// failure that leaves the part's fate unknown, the writer raises its
    /// epoch before sending it again (see `Fence::raise_past`); a refusal
    /// by its own raised epoch sends it again under the new one.
    async fn send_part(&self, part: SlotPart<'_>) -> Result<(), SinkError> {
        let mut epoch = self.fence.as_ref().map(Fence::epoch);
        let mut call = self.part_call(&part, epoch);
        let mut attempts = self.retry.start();
        let mut repairs = 0;
        loop {
            if let Some(fence) = &self.fence {
                if !fence.is_valid() {
                    return Err(SinkError::LeaseLost);
                }
                if epoch != Some(fence.epoch()) {
                    epoch = Some(fence.epoch());
                    call = self.part_call(&part, epoch);
                }
            }
            let mut conn = self.conn.clone();
            let err = match call.run(&mut conn).await.map_err(classify) {
                Ok(()) => return Ok(()),
                Err(err) => err,
            };
            match (err, &self.fence, epoch) {
                (PartError::Fenced, Some(fence), Some(sent)) if fence.epoch() > sent && attempts.again_now() => {}
                (PartError::Fenced, Some(fence), _) => {
                    fence.mark_lost();
                    return Err(SinkError::Fenced { epoch: fence.epoch() });
                }
                (PartError::EpochLow, Some(fence), _) if repairs < 3 => {
                    repairs += 1;
                    self.repair_epoch_copy(fence, part.slot).await?;
                }
                (PartError::Redis(err), _, _) if is_retriable(&err) => {
                    let Some(delay) = attempts.next_pause() else {
                        return Err(SinkError::Write { attempts: attempts.made(), source: err });
                    };
                    if let (Some(fence), Some(sent)) = (&self.fence, epoch)
                        && crate::sink::is_ambiguous(&err)
                    {
                        self.raise_own_epoch(fence, sent).await?;
                    }
                    tracing::warn!(attempt = attempts.made() - 1, slot = part.slot, delay_ms = delay.as_millis() as u64, error = %err, "cluster write failed, retrying");
                    tokio::time::sleep(delay).await;
                }
                (PartError::Redis(source), _, _) => return Err(SinkError::Write { attempts: attempts.made(), source }),
                (PartError::Fenced | PartError::EpochLow, _, _) => {
                    return Err(SinkError::Cluster(format!(
                        "slot {} refused a write: its epoch copy could not be brought to this writer's epoch",
                        part.slot
                    )));
                }
            }
        }
    }

    /// A slot's copy is missing (its master restarted empty) or behind:
    /// raised only while the epoch key itself still holds this writer's
    /// epoch, else the writer was taken over.
    async fn repair_epoch_copy(&self, fence: &Fence, slot: u16) -> Result<(), SinkError> {
        let mut conn = self.conn.clone();
        let current: Option<u64> = redis::cmd("GET")
            .arg(&fence.key)
            .query_async(&mut conn)
            .await
            .map_err(|source| SinkError::Write { attempts: 1, source })?;
        let epoch = fence.epoch();
        if current != Some(epoch) {
            fence.mark_lost();
            return Err(SinkError::Fenced { epoch });
        }
        tracing::debug!(slot, epoch, "restoring a slot's epoch copy");
        self.raise_copy(epoch, slot).await
    }

    async fn raise_copy(&self, epoch: u64, slot: u16) -> Result<(), SinkError> {
        let key = crate::keys::status::epoch_copy_key(&self.status_prefix, slot);
        let epoch = epoch.to_string();
        let call = ScriptCall::new(&cluster::RAISE, &[key.as_bytes()], &[epoch.as_bytes()]);
        let conn = &self.conn;
        self.retry
            .run(|| {
                let (call, mut conn) = (&call, conn.clone());
                async move { call.run(&mut conn).await }
            })
            .await
            .map_err(|(attempts, source)| SinkError::Write { attempts, source })
    }

    /// Raises the epoch's copy in every covered slot to `fence`'s epoch,
    /// before the new writer's first write: a few hundred copies per
    /// script, one pipeline per master, the masters in parallel. A few
    /// copies a master refused (a slot moved or moving) are then raised
    /// one by one, following the cluster; many (a master that stopped
    /// answering) are tried again per master after a fresh slot map, until
    /// the cluster flags that master failed.
    ///
    /// A slot no live master covers keeps its old copy: the writer's
    /// first write there, once it is covered again, finds the copy behind
    /// and raises it first (see `send_part`), so nothing older lands after
    /// it. Until then nobody can write there at all.
    pub(in crate::sink) async fn raise_epoch_copies(&self, router: &Router, fence: &Fence) -> Result<(), SinkError> {
        let epoch_now = fence.epoch();
        let epoch = epoch_now.to_string();
        let mut left: Vec<u16> = (0..cluster::SLOTS as u16).collect();
        let mut skipped = 0;
        for round in 0..ARM_ROUNDS {
            if round > 0 {
                tokio::time::sleep(ARM_PAUSE).await;
                let _ = router.refresh().await;
            }
            let (by_master, uncovered) = router.by_master(std::mem::take(&mut left), |slot| *slot);
            skipped = uncovered.len();
            let chunks = by_master
                .into_iter()
                .map(|(addr, slots)| (addr, slots.chunks(COPIES_PER_SCRIPT).map(<[u16]>::to_vec).collect()))
                .collect();
            // Raising a copy is idempotent and only ever raises: a late
            // one does no harm, so the fate of a lost reply does not
            // matter here.
            let (sent, _) = self
                .per_master_pipelines(router, chunks, |slots: &Vec<u16>, named| {
                    let mut cmd = cluster::RAISE_GROUP.call(named);
                    cmd.arg(0).arg(&epoch);
                    for slot in slots {
                        cmd.arg(crate::keys::status::epoch_copy_key(&self.status_prefix, *slot));
                    }
                    cmd
                })
                .await;
            for (slots, reply) in sent {
                match reply.map(redis::from_redis_value::<Vec<usize>>) {
                    Some(Ok(positions)) => left.extend(
                        positions.into_iter().filter_map(|p| p.checked_sub(1).and_then(|i| slots.get(i)).copied()),
                    ),
                    _ => left.extend(slots),
                }
            }
            if left.len() <= PARTS_IN_FLIGHT {
                break;
            }
        }
        if left.len() > PARTS_IN_FLIGHT {
            return Err(SinkError::Cluster(format!(
                "{} slots' epoch copies could not be raised: their master neither answers nor is flagged \
                 failed by the cluster; check CLUSTER NODES",
                left.len()
            )));
        }
        futures::stream::iter(left)
            .map(|slot| async move {
                match self.raise_copy(epoch_now, slot).await {
                    Err(_) if router.owner(Some(slot)).is_none() => Ok(1),
                    other => other.map(|()| 0),
                }
            })
            .buffer_unordered(PARTS_IN_FLIGHT)
            .try_for_each(|n| {
                skipped += n;
                futures::future::ready(Ok(()))
            })
            .await?;
        if skipped > 0 {
            tracing::warn!(
                slots = skipped,
                "slots without a live master keep their old epoch copy; the first write to each, once covered, raises it"
            );
        }
        Ok(())
    }

    /// Sends `cmd` to the node at `host:port`.
    pub(in crate::sink) async fn on_node(&self, node: &str, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        self.topology().on_node(node, cmd).await
    }

    /// The masters and their slots, and whether a slot is moving.
    async fn layout(&self, router: &Router) -> Result<(Layout, bool), SinkError> {
        let reply = router.request(redis::cmd("CLUSTER").arg("SLOTS")).await.map_err(read_err)?;
        let layout = cluster::parse_slots(&reply)
            .ok_or_else(|| SinkError::Cluster("CLUSTER SLOTS gave a reply this version cannot read".into()))?;
        let nodes = self.text_of_each(&layout.masters, redis::cmd("CLUSTER").arg("NODES")).await?;
        let moving = nodes.iter().any(|text| cluster::moving_slots(text));
        Ok((layout, moving))
    }

    /// The text reply of `cmd` from each of `nodes`, asked in parallel.
    pub(in crate::sink) async fn text_of_each(
        &self,
        nodes: &[String],
        cmd: &redis::Cmd,
    ) -> Result<Vec<String>, SinkError> {
        let replies = futures::future::join_all(
            nodes.iter().map(|node| async { parse::<String>(self.on_node(node, cmd).await.map_err(read_err)?) }),
        )
        .await;
        replies.into_iter().collect()
    }

    /// `INFO` of `sections` from every live master, with its address, in
    /// address order. A master that stopped answering may have been
    /// flagged failed since the map was read: on a failure the map is read
    /// again and the live masters asked once more.
    async fn info_of_masters(&self, router: &Router, sections: &[&str]) -> Result<Vec<(String, String)>, SinkError> {
        let mut cmd = redis::cmd("INFO");
        for section in sections {
            cmd.arg(*section);
        }
        let ask = |masters: Vec<String>| async {
            let infos = self.text_of_each(&masters, &cmd).await?;
            Ok::<_, SinkError>(masters.into_iter().zip(infos).collect())
        };
        match ask(router.masters()).await {
            Ok(pairs) => Ok(pairs),
            Err(_) => {
                let _ = router.refresh().await;
                ask(router.masters()).await
            }
        }
    }

    /// The slots no live master covers now, as ranges: empty but on a
    /// cluster that lost a master with no replica to take over (or has
    /// slots unassigned). Writes there are refused until it is covered.
    pub fn uncovered_slots(&self) -> Vec<(u16, u16)> {
        self.topology().uncovered()
    }

    /// Whether a live master covers `key`'s slot (always, but on a
    /// cluster).
    pub fn covers(&self, key: &[u8]) -> bool {
        self.topology().covers(key)
    }

    /// Reads where the masters are again (on a cluster, a master flagged
    /// failed, or back).
    pub async fn refresh_topology(&self) {
        if let Err(err) = self.topology().refresh_masters().await {
            tracing::debug!(error = %err, "could not read where the Redis masters are");
        }
    }

    /// Sends every key matching `glob` on every master into `found` (all
    /// of them scanned at once, the batches sent on as they come). When
    /// the slot map changes during the pass, or a slot is moving, a key
    /// may have gone from an unscanned master to a scanned one: the pass
    /// is then thrown away (`Scanned::Restart`) and made again once the
    /// slots settle.
    pub(in crate::sink) async fn scan_masters(
        &self,
        router: &Router,
        glob: &str,
        found: tokio::sync::mpsc::Sender<Scanned>,
    ) -> Result<(), SinkError> {
        let started = tokio::time::Instant::now();
        loop {
            let (before, moving) = self.layout(router).await?;
            if !moving {
                // Every master at once; the batches go on as they come.
                let scans = before.masters.iter().map(|node| self.scan_node(node, glob, &found));
                futures::future::try_join_all(scans).await?;
                if found.is_closed() {
                    return Ok(());
                }
                let (after, moving) = self.layout(router).await?;
                if !moving && after == before {
                    return Ok(());
                }
                if found.send(Scanned::Restart).await.is_err() {
                    return Ok(());
                }
            }
            if started.elapsed() > SETTLE_WAIT {
                return Err(SinkError::Cluster(format!(
                    "the cluster's slots kept moving for {} s, so a scan could not see every key once; \
                     run this again when the resharding is done",
                    SETTLE_WAIT.as_secs()
                )));
            }
            tracing::info!("cluster slots are moving; scanning again once they settle");
            tokio::time::sleep(SETTLE_PAUSE).await;
        }
    }
}

/// Merges INFO replies: each numeric field summed, other fields taken
/// from the first reply.
pub fn sum_info(replies: &[String]) -> String {
    let mut fields: indexmap::IndexMap<&str, (String, Option<f64>)> = indexmap::IndexMap::new();
    for reply in replies {
        for line in reply.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.split_once(':') else { continue };
            let value = value.trim();
            let number = value.parse::<f64>().ok();
            match fields.get_mut(name) {
                Some((_, Some(sum))) => *sum += number.unwrap_or(0.0),
                Some(_) => {}
                None => {
                    fields.insert(name, (value.to_string(), number));
                }
            }
        }
    }
    fields
        .into_iter()
        .map(|(name, (text, sum))| match sum {
            Some(sum) if sum.fract() == 0.0 => format!("{name}:{}\r\n", sum as i64),
            Some(sum) => format!("{name}:{sum}\r\n"),
            None => format!("{name}:{text}\r\n"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn info_of_the_masters_is_summed() {
        let a = "# Memory\r\nused_memory:100\r\nmaxmemory_policy:noeviction\r\nmem_fragmentation_ratio:1.5\r\n";
        let b = "# Memory\r\nused_memory:250\r\nmaxmemory_policy:noeviction\r\nmem_fragmentation_ratio:1.25\r\n";
        let merged = super::sum_info(&[a.to_string(), b.to_string()]);
        assert_eq!(crate::sink::info_value(&merged, "used_memory"), Some("350"));
        assert_eq!(crate::sink::info_value(&merged, "maxmemory_policy"), Some("noeviction"));
        assert_eq!(crate::sink::info_value(&merged, "mem_fragmentation_ratio"), Some("2.75"));
    }
}

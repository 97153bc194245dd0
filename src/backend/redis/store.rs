//! [`RoomStore`] on Redis: a room's log is a Redis Stream, its image a
//! hash, its lease a key with an expiry beside a fencing counter, its
//! command bus a second stream; replies go to a stream per instance.
//!
//! Keys carry the store's schema version and the room's hash tag
//! (`narabu:v7:{room}:log`), so one room's keys share a Redis Cluster slot
//! and the scripts below can touch them together, and a Redis written by
//! an earlier Narabu is recognised ([`RedisStore::check_schema`]) rather
//! than misread. The only Lua is the lease's (`lease_*.lua`), its
//! acquisition (a fencing token higher than any before, marked in the log)
//! and the fenced image (`store_*.lua`): no admission rule.
//!
//! The log is fenced by its entries' ids: an owner appends with plain
//! `XADD <token>-<n>`, its fencing token as the id's first part, and a new
//! owner's acquisition puts its mark (`<token>-0`) in the log, so Redis
//! refuses an earlier owner's late append as an id below the stream's
//! last. An append is then one command with no script to run, the
//! cheapest write a stream has. The owner counts `<n>` itself rather than
//! leaving it to Redis: a primary that took over from one that failed may
//! lack the last entries, and would number the next ones as those were,
//! below where a copy already read.
//!
//! A batch is one stream entry, whatever the number of records in it: one
//! `XADD` is the store's cost of a batch, which is why owners gather the
//! records of concurrent requests before appending. Commands and replies
//! travel the same way: a slice of them is one entry.
//!
//! A read that waits (`XREAD BLOCK`) runs on a connection of its own, so it
//! never holds up the commands queued on the shared one: one connection
//! given at the start, or, with a [`Connector`], one from a pool that
//! opens another whenever every pooled one is waiting (an instance reads
//! each room's log, each owned room's commands and its replies at once).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionLike;
use redis::streams::{
    StreamId, StreamMaxlen, StreamRangeReply, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, RedisError, Script, Value};
use tokio::sync::Mutex;

use super::conn::what_failed;
use crate::backend::store::{Command, Entry, Fence, Image, LogPos, Reply, RoomStore, StoreError};
use crate::engine::RoomId;

/// The schema these keys follow. An earlier Narabu kept every room's state
/// in Redis under unversioned keys (`narabu:rooms`, `narabu:{room}:room`).
pub(crate) const SCHEMA: u32 = 7;
const SCHEMA_KEY: &str = "narabu:schema";
const EARLIER_ROOMS_KEY: &str = "narabu:rooms";
/// The rooms of this schema, by name.
const ROOMS_KEY: &str = "narabu:v7:rooms";

/// How many replies an instance's stream keeps, and for how long once its
/// reader stops reading (a dead instance's replies go away by themselves).
const REPLIES_KEPT: usize = 65_536;
const REPLIES_TTL_S: i64 = 60;
/// The field of a command or reply stream's entry that holds its slice.
const SLICE: &str = "s";
/// The field of a log entry that holds its batch; a new owner's mark has
/// another (`o`, the lease it took) and no records.
const BATCH: &str = "b";

struct Keys {
    lease: String,
    fence: String,
    log: String,
    image: String,
    commands: String,
    reports: String,
}

impl Keys {
    fn new(room: &RoomId) -> Self {
        let prefix = format!("narabu:v{SCHEMA}:{{{room}}}:");
        Self {
            lease: format!("{prefix}lease"),
            fence: format!("{prefix}fence"),
            log: format!("{prefix}log"),
            image: format!("{prefix}image"),
            commands: format!("{prefix}cmd"),
            reports: format!("{prefix}reports"),
        }
    }
}

fn replies_key(instance: &str) -> String {
    format!("narabu:v{SCHEMA}:{{reply-{instance}}}")
}

impl RedisStore<super::conn::Conn, super::conn::Blocking> {
    /// The store on the deployment's Redis (one server, Sentinel's primary
    /// of the moment, or a Cluster), schema checked; failing with a message
    /// fit for an operator (never a URL, which may hold a password).
    pub async fn connect(
        target: &super::target::RedisTarget,
        wait: super::target::RedisWait,
    ) -> anyhow::Result<Self> {
        let conn = super::conn::Conn::connect(target).await?;
        if wait.is_on() {
            check_replicas(&conn, wait).await;
        }
        let (opener, target) = (conn.clone(), target.clone());
        let connector: Connector<super::conn::Blocking> = std::sync::Arc::new(move || {
            let (opener, target) = (opener.clone(), target.clone());
            Box::pin(async move { opener.blocking(&target).await })
        });
        let store = Self::pooled(conn, connector)
            .await
            .map_err(|e| anyhow::anyhow!(what_failed(&e)))?
            .waiting(wait);
        store.check_schema().await?;
        Ok(store)
    }
}

/// At start: say plainly when the primary has fewer replicas than every
/// change will wait for (a replica may still be on its way, so this is not
/// fatal; until it comes, changes fail with 503).
async fn check_replicas(conn: &super::conn::Conn, wait: super::target::RedisWait) {
    let info: redis::RedisResult<String> = redis::cmd("INFO")
        .arg("replication")
        .query_async(&mut conn.clone())
        .await;
    let connected = info.ok().and_then(|text| {
        text.lines()
            .find_map(|l| l.strip_prefix("connected_slaves:"))
            .and_then(|n| n.trim().parse::<u32>().ok())
    });
    match connected {
        Some(n) if n >= wait.replicas => {
            tracing::info!(
                replicas = n,
                wait_for = wait.replicas,
                "changes wait for redis replicas"
            );
        }
        Some(n) => tracing::warn!(
            replicas = n,
            wait_for = wait.replicas,
            "the redis primary has fewer replicas than redis_wait_replicas: joins and \
             admissions fail with 503 until enough are connected"
        ),
        None => tracing::warn!("could not read the redis primary's replicas (INFO replication)"),
    }
}

/// A connection of one's own, for as long as it is held.
enum Own<'a, B> {
    Single(tokio::sync::MutexGuard<'a, B>),
    Pooled(B),
}

impl<B> std::ops::Deref for Own<'_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        match self {
            Self::Single(con) => con,
            Self::Pooled(con) => con,
        }
    }
}

impl<B> std::ops::DerefMut for Own<'_, B> {
    fn deref_mut(&mut self) -> &mut B {
        match self {
            Self::Single(con) => con,
            Self::Pooled(con) => con,
        }
    }
}

/// Opens a connection for reads that wait.
pub(crate) type Connector<C> = std::sync::Arc<
    dyn Fn() -> futures_util::future::BoxFuture<'static, redis::RedisResult<C>> + Send + Sync,
>;

/// The store, over a shared connection for everything that does not wait
/// and a connection of its own for reads that do.
pub struct RedisStore<C, B = C> {
    conn: C,
    blocking: Mutex<B>,
    /// Connections for reads that wait, when more can be opened.
    pool: std::sync::Mutex<Vec<B>>,
    connector: Option<Connector<B>>,
    /// Appends are acknowledged once this many replicas have them.
    wait: super::target::RedisWait,
    acquire: Script,
    write: Script,
    extend: Script,
    give_up: Script,
}

impl<C, B> RedisStore<C, B>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    B: ConnectionLike + Send + Sync + 'static,
{
    /// `blocking` must be a connection no one else uses: a waiting read
    /// holds it for up to its wait.
    pub fn new(conn: C, blocking: B) -> Self {
        Self {
            conn,
            blocking: Mutex::new(blocking),
            pool: std::sync::Mutex::new(Vec::new()),
            connector: None,
            wait: super::target::RedisWait::OFF,
            acquire: Script::new(include_str!("store_acquire.lua")),
            write: Script::new(include_str!("store_image.lua")),
            extend: Script::new(include_str!("lease_extend.lua")),
            give_up: Script::new(include_str!("lease_release.lua")),
        }
    }

    /// A store whose reads that wait each take a pooled connection, opened
    /// by `connector` when none is free: any number of readers wait at once.
    pub(crate) async fn pooled(conn: C, connector: Connector<B>) -> redis::RedisResult<Self> {
        let first = connector().await?;
        let mut store = Self::new(conn, first);
        store.connector = Some(connector);
        Ok(store)
    }

    /// Acknowledge an append only once `wait.replicas` replicas confirm it
    /// (`WAIT`), on a connection of the append's own so the wait holds up
    /// no other command.
    pub(crate) fn waiting(mut self, wait: super::target::RedisWait) -> Self {
        self.wait = wait;
        self
    }

    /// A connection no one else uses: one from the pool (opened when none
    /// is free), or the single one given at the start.
    async fn own_connection(&self) -> Result<Own<'_, B>, StoreError> {
        let Some(connect) = &self.connector else {
            return Ok(Own::Single(self.blocking.lock().await));
        };
        let pooled = self
            .pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        match pooled {
            Some(con) => Ok(Own::Pooled(con)),
            None => connect().await.map(Own::Pooled).map_err(unavailable),
        }
    }

    /// Put a connection back in the pool, unless it failed.
    fn give_back<T>(&self, con: Own<'_, B>, out: &Result<T, StoreError>) {
        if let Own::Pooled(con) = con
            && !matches!(out, Err(StoreError::Unavailable(_)))
        {
            self.pool
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(con);
        }
    }

    /// Refuse a Redis that holds another schema's rooms, naming what was
    /// found, and mark a fresh one as this schema's.
    pub async fn check_schema(&self) -> Result<(), StoreError> {
        let mut con = self.conn.clone();
        let found: Option<u32> = con.get(SCHEMA_KEY).await.map_err(unavailable)?;
        match found {
            Some(SCHEMA) => return Ok(()),
            Some(other) => {
                return Err(StoreError::Damaged(format!(
                    "this Redis holds rooms in Narabu's store schema {other}; this version \
                     reads schema {SCHEMA} only. Run the version that wrote it until its \
                     rooms are done, or point this one at another Redis (or database)"
                )));
            }
            None => {}
        }
        let earlier: bool = con.exists(EARLIER_ROOMS_KEY).await.map_err(unavailable)?;
        if earlier {
            return Err(StoreError::Damaged(format!(
                "this Redis holds rooms written by an earlier Narabu ({EARLIER_ROOMS_KEY} and \
                 narabu:{{room}}:* keys, before store schemas were numbered); this version \
                 reads schema {SCHEMA} only. Run the earlier version until its rooms are \
                 done, or point this one at another Redis (or database)"
            )));
        }
        let _: bool = con.set_nx(SCHEMA_KEY, SCHEMA).await.map_err(unavailable)?;
        let now: Option<u32> = con.get(SCHEMA_KEY).await.map_err(unavailable)?;
        match now {
            Some(SCHEMA) => Ok(()),
            _ => Err(StoreError::Damaged(
                "another Narabu version marked this Redis at the same moment".to_owned(),
            )),
        }
    }

    /// Drop a stream's entries at and before `upto`.
    async fn drop_upto(&self, key: &str, upto: LogPos) -> Result<(), StoreError> {
        let mut con = self.conn.clone();
        let _: i64 = redis::cmd("XTRIM")
            .arg(key)
            .arg("MINID")
            .arg(after(upto))
            .query_async(&mut con)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// A read of `key` after `after`: at once on the shared connection, or
    /// waiting on the blocking one.
    async fn read_stream(
        &self,
        key: &str,
        after: LogPos,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<StreamId>, StoreError> {
        let options = StreamReadOptions::default().count(max.max(1));
        let after = after.to_string();
        let reply: Option<StreamReadReply> = if wait.is_zero() {
            let mut con = self.conn.clone();
            con.xread_options(&[key], &[&after], &options)
                .await
                .map_err(unavailable)?
        } else {
            let wait_ms = usize::try_from(wait.as_millis())
                .unwrap_or(usize::MAX)
                .max(1);
            let options = options.block(wait_ms);
            let mut con = self.own_connection().await?;
            let reply = con
                .xread_options(&[key], &[&after], &options)
                .await
                .map_err(unavailable);
            self.give_back(con, &reply);
            reply?
        };
        Ok(reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default())
    }
}

fn unavailable(e: RedisError) -> StoreError {
    if e.code() == Some("FENCED") {
        return StoreError::Fenced;
    }
    StoreError::Unavailable(what_failed(&e).to_owned())
}

fn pos(id: &str) -> Result<LogPos, StoreError> {
    id.parse()
}

fn bytes(entry: &StreamId, field: &str) -> Result<Vec<u8>, StoreError> {
    match entry.map.get(field) {
        Some(Value::BulkString(b)) => Ok(b.clone()),
        _ => Err(StoreError::Damaged(format!(
            "entry {} has no field {field:?}",
            entry.id
        ))),
    }
}

/// What one entry of the command or reply stream carries: a slice of
/// commands or replies, as one value.
fn slice<T: serde::de::DeserializeOwned>(entry: &StreamId) -> Result<T, StoreError> {
    postcard::from_bytes(&bytes(entry, SLICE)?)
        .map_err(|_| StoreError::Damaged(format!("entry {}: an unreadable slice", entry.id)))
}

/// The first position after `upto`: `XTRIM … MINID` keeps what is at or
/// after its threshold.
fn after(upto: LogPos) -> String {
    match upto.seq.checked_add(1) {
        Some(seq) => format!("{}-{seq}", upto.ms),
        None => format!("{}-0", upto.ms + 1),
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[async_trait]
impl<C, B> RoomStore for RedisStore<C, B>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    B: ConnectionLike + Send + Sync + 'static,
{
    async fn acquire(
        &self,
        room: &RoomId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Fence>, StoreError> {
        let k = Keys::new(room);
        let mut con = self.conn.clone();
        let (token, _value): (u64, String) = self
            .acquire
            .key(&k.lease)
            .key(&k.fence)
            .key(&k.log)
            .arg(holder)
            .arg(ttl_ms(ttl))
            .invoke_async(&mut con)
            .await
            .map_err(unavailable)?;
        Ok((token > 0).then(|| Fence {
            token,
            holder: holder.to_owned(),
            mark: LogPos { ms: token, seq: 0 },
        }))
    }

    async fn renew(&self, room: &RoomId, fence: &Fence, ttl: Duration) -> Result<bool, StoreError> {
        let k = Keys::new(room);
        let mut con = self.conn.clone();
        let n: i64 = self
            .extend
            .key(&k.lease)
            .arg(fence.lease_value())
            .arg(ttl_ms(ttl))
            .invoke_async(&mut con)
            .await
            .map_err(unavailable)?;
        Ok(n == 1)
    }

    async fn release(&self, room: &RoomId, fence: &Fence) -> Result<bool, StoreError> {
        let k = Keys::new(room);
        let mut con = self.conn.clone();
        let n: i64 = self
            .give_up
            .key(&k.lease)
            .arg(fence.lease_value())
            .invoke_async(&mut con)
            .await
            .map_err(unavailable)?;
        Ok(n == 1)
    }

    async fn add_room(&self, room: &RoomId) -> Result<(), StoreError> {
        let mut con = self.conn.clone();
        let _: u32 = con
            .sadd(ROOMS_KEY, room.as_str())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn rooms(&self) -> Result<Vec<RoomId>, StoreError> {
        let mut con = self.conn.clone();
        let names: Vec<String> = con.smembers(ROOMS_KEY).await.map_err(unavailable)?;
        // A name that is not a room id was not written by Narabu.
        Ok(names.iter().filter_map(|n| RoomId::new(n).ok()).collect())
    }

    async fn holder(&self, room: &RoomId) -> Result<Option<String>, StoreError> {
        let mut con = self.conn.clone();
        con.get(Keys::new(room).lease).await.map_err(unavailable)
    }

    async fn append(
        &self,
        room: &RoomId,
        fence: &Fence,
        after: LogPos,
        batch: &[u8],
    ) -> Result<LogPos, StoreError> {
        // Fenced by the entry's id: a successor's lease marked the log
        // with its higher token, after which XADD refuses this lower one.
        let mut xadd = redis::cmd("XADD");
        xadd.arg(Keys::new(room).log)
            .arg(after.next_for(fence.token).to_string())
            .arg(BATCH)
            .arg(batch);
        let fenced = |e: RedisError| {
            if e.detail().is_some_and(|d| d.contains("equal or smaller")) {
                StoreError::Fenced
            } else {
                unavailable(e)
            }
        };
        if !self.wait.is_on() {
            let mut con = self.conn.clone();
            let id: String = xadd.query_async(&mut con).await.map_err(fenced)?;
            return pos(&id);
        }
        // WAIT counts the writes of the connection it is sent on.
        let mut con = self.own_connection().await?;
        let out = async {
            let id: String = xadd.query_async(&mut *con).await.map_err(fenced)?;
            let confirmed: u32 = redis::cmd("WAIT")
                .arg(self.wait.replicas)
                .arg(u64::try_from(self.wait.timeout.as_millis()).unwrap_or(u64::MAX))
                .query_async(&mut *con)
                .await
                .map_err(unavailable)?;
            if confirmed < self.wait.replicas {
                return Err(StoreError::NotReplicated);
            }
            Ok(id)
        }
        .await;
        self.give_back(con, &out);
        pos(&out?)
    }

    async fn read(
        &self,
        room: &RoomId,
        after: LogPos,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Entry>, StoreError> {
        let k = Keys::new(room);
        self.read_stream(&k.log, after, max, wait)
            .await?
            .iter()
            .map(|e| {
                Ok(Entry {
                    pos: pos(&e.id)?,
                    // An owner's mark, which carries no records.
                    batch: if e.map.contains_key(BATCH) {
                        bytes(e, BATCH)?
                    } else {
                        Vec::new()
                    },
                })
            })
            .collect()
    }

    async fn last(&self, room: &RoomId) -> Result<Option<LogPos>, StoreError> {
        let mut con = self.conn.clone();
        let reply: StreamRangeReply = con
            .xrevrange_count(Keys::new(room).log, "+", "-", 1)
            .await
            .map_err(unavailable)?;
        reply.ids.first().map(|e| pos(&e.id)).transpose()
    }

    async fn trim(&self, room: &RoomId, upto: LogPos) -> Result<(), StoreError> {
        self.drop_upto(&Keys::new(room).log, upto).await
    }

    async fn put_image(
        &self,
        room: &RoomId,
        fence: &Fence,
        image: &Image,
    ) -> Result<(), StoreError> {
        let k = Keys::new(room);
        let mut con = self.conn.clone();
        let _: String = self
            .write
            .key(&k.fence)
            .key(&k.image)
            .arg(fence.token)
            .arg(&image.bytes)
            .arg(image.at.to_string())
            .invoke_async(&mut con)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn image(&self, room: &RoomId) -> Result<Option<Image>, StoreError> {
        let mut con = self.conn.clone();
        let (at, bytes): (Option<String>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(Keys::new(room).image)
            .arg("at")
            .arg("image")
            .query_async(&mut con)
            .await
            .map_err(unavailable)?;
        match (at, bytes) {
            (Some(at), Some(bytes)) => Ok(Some(Image {
                at: pos(&at)?,
                bytes,
            })),
            _ => Ok(None),
        }
    }

    async fn put_report(
        &self,
        room: &RoomId,
        epoch: u64,
        report: &[u8],
        ttl: Duration,
    ) -> Result<(), StoreError> {
        // Each report a key that expires by itself, and an index of them;
        // the room's hash tag keeps both on one slot.
        let k = Keys::new(room);
        let key = format!("{}:{epoch}", k.reports);
        let mut con = self.conn.clone();
        redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(report)
            .arg("PX")
            .arg(ttl_ms(ttl))
            .ignore()
            .sadd(&k.reports, &key)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&k.reports)
            .arg(ttl_ms(ttl))
            .arg("GT")
            .ignore()
            .query_async::<()>(&mut con)
            .await
            .map_err(unavailable)
    }

    async fn reports(&self, room: &RoomId) -> Result<Vec<Vec<u8>>, StoreError> {
        let k = Keys::new(room);
        let mut con = self.conn.clone();
        let keys: Vec<String> = con.smembers(&k.reports).await.map_err(unavailable)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let found: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut con)
            .await
            .map_err(unavailable)?;
        // The index keeps a key until its report is looked for after it
        // expired; dropping it then keeps the index as small as the shelf.
        let gone: Vec<&String> = keys
            .iter()
            .zip(&found)
            .filter_map(|(k, f)| f.is_none().then_some(k))
            .collect();
        if !gone.is_empty() {
            let _: i64 = con.srem(&k.reports, gone).await.map_err(unavailable)?;
        }
        Ok(found.into_iter().flatten().collect())
    }

    fn appends_wait_for_replicas(&self) -> bool {
        self.wait.is_on()
    }

    async fn send(&self, room: &RoomId, commands: &[Command]) -> Result<(), StoreError> {
        if commands.is_empty() {
            return Ok(());
        }
        // The whole slice is one entry: Redis's cost is per command it
        // runs, and one `XADD` a slice instead of one a request is most
        // of what a forwarded change costs it.
        let slice = postcard::to_allocvec(commands).expect("commands serialize");
        let mut con = self.conn.clone();
        let _: String = con
            .xadd(Keys::new(room).commands, "*", &[(SLICE, slice)])
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn receive(
        &self,
        room: &RoomId,
        after: LogPos,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(LogPos, Command)>, StoreError> {
        let key = Keys::new(room).commands;
        let mut commands = Vec::new();
        for entry in self.read_stream(&key, after, max, wait).await? {
            let at = pos(&entry.id)?;
            // A slice this version cannot read (another version's
            // instance sent it) is passed over rather than read again and
            // again: its senders time out and are told to try again.
            match slice::<Vec<Command>>(&entry) {
                Ok(slice) => commands.extend(slice.into_iter().map(|c| (at, c))),
                Err(e) => tracing::warn!(room = %room, error = %e, "commands passed over"),
            }
        }
        Ok(commands)
    }

    async fn consumed(&self, room: &RoomId, upto: LogPos) -> Result<(), StoreError> {
        self.drop_upto(&Keys::new(room).commands, upto).await
    }

    async fn reply(&self, replies: &[Reply]) -> Result<(), StoreError> {
        // One entry per instance, all sent at once: each instance's
        // replies live on its own slot, and a Redis Cluster takes a
        // pipeline to one slot only.
        let mut by_instance: HashMap<&str, Vec<(u128, &[u8])>> = HashMap::new();
        for r in replies {
            by_instance
                .entry(r.to.as_str())
                .or_default()
                .push((r.id, &r.body));
        }
        futures_util::future::try_join_all(by_instance.into_iter().map(|(to, slice)| {
            let key = replies_key(to);
            let slice = postcard::to_allocvec(&slice).expect("replies serialize");
            let mut pipe = redis::pipe();
            pipe.xadd_maxlen(
                &key,
                StreamMaxlen::Approx(REPLIES_KEPT),
                "*",
                &[(SLICE, slice)],
            )
            .ignore()
            .expire(&key, REPLIES_TTL_S)
            .ignore();
            let mut con = self.conn.clone();
            async move { pipe.query_async::<()>(&mut con).await }
        }))
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn replies(
        &self,
        instance: &str,
        after: LogPos,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(LogPos, Reply)>, StoreError> {
        let mut replies = Vec::new();
        for entry in self
            .read_stream(&replies_key(instance), after, max, wait)
            .await?
        {
            let at = pos(&entry.id)?;
            match slice::<Vec<(u128, Vec<u8>)>>(&entry) {
                Ok(slice) => replies.extend(slice.into_iter().map(|(id, body)| {
                    (
                        at,
                        Reply {
                            to: instance.to_owned(),
                            id,
                            body,
                        },
                    )
                })),
                Err(e) => tracing::warn!(error = %e, "replies passed over"),
            }
        }
        Ok(replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rooms_keys_share_its_slot_and_name_the_schema() {
        let k = Keys::new(&RoomId::new("sale").unwrap());
        for key in [&k.lease, &k.fence, &k.log, &k.image, &k.commands] {
            assert!(key.starts_with("narabu:v7:{sale}:"), "{key}");
        }
    }

    #[test]
    fn a_trim_keeps_what_follows_its_position() {
        assert_eq!(after(LogPos { ms: 5, seq: 2 }), "5-3");
        assert_eq!(
            after(LogPos {
                ms: 5,
                seq: u64::MAX
            }),
            "6-0"
        );
    }
}

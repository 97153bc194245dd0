//! Narabu's visitor API as the tool uses it, over [`crate::http::Conn`]:
//! join, status, leave, gate, the event stream, and the admin room stats
//! (optional: servers without the admin API answer 404, which is fine).

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;

use crate::cli::Target;
use crate::http::{Conn, Response, request};

/// What went wrong, as a short kind for the "errors by kind" table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl Failure {
    pub fn io(stage: &str, e: &std::io::Error) -> Self {
        Self(format!("{stage}: {:?}", e.kind()))
    }
    pub fn http(stage: &str, status: u16) -> Self {
        Self(format!("{stage}: HTTP {status}"))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone)]
pub struct Ticket {
    pub token: String,
    pub number: u64,
    pub status: String,
}

#[derive(Debug, Clone)]
pub struct Api {
    pub addr: SocketAddr,
    pub host: String,
    pub room: String,
}

impl Api {
    pub fn new(target: &Target, room: &str) -> Self {
        Self {
            addr: target.addr,
            host: target.host_header(),
            room: room.to_owned(),
        }
    }

    pub async fn connect(&self, source: Option<IpAddr>) -> Result<Conn, Failure> {
        Conn::connect(self.addr, source)
            .await
            .map_err(|e| Failure::io("connect", &e))
    }

    pub fn join_request(&self) -> Vec<u8> {
        request(
            "POST",
            &format!("/api/rooms/{}/join", self.room),
            &self.host,
            &[],
            b"",
        )
    }

    /// A join carrying a JSON body (a proof-of-work solution, an enqueue
    /// token).
    pub fn join_request_with(&self, body: &serde_json::Value) -> Vec<u8> {
        let body = body.to_string();
        request(
            "POST",
            &format!("/api/rooms/{}/join", self.room),
            &self.host,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    }

    pub fn challenge_request(&self) -> Vec<u8> {
        request(
            "GET",
            &format!("/api/rooms/{}/challenge", self.room),
            &self.host,
            &[],
            b"",
        )
    }

    /// Send a prepared request and take whatever answer comes.
    pub async fn send(
        &self,
        conn: &mut Conn,
        stage: &str,
        req: &[u8],
    ) -> Result<Response, Failure> {
        Self::call(conn, stage, req).await
    }

    pub fn gate_request(&self, token: &str) -> Vec<u8> {
        let cookie = format!("narabu_{}={token}", self.room);
        request(
            "GET",
            &format!("/gate/{}", self.room),
            &self.host,
            &[("Cookie", &cookie)],
            b"",
        )
    }

    pub fn events_request(&self, token: &str) -> Vec<u8> {
        let bearer = format!("Bearer {token}");
        request(
            "GET",
            &format!("/api/rooms/{}/events", self.room),
            &self.host,
            &[("Authorization", &bearer), ("Accept", "text/event-stream")],
            b"",
        )
    }

    fn bearer_request(&self, method: &str, what: &str, token: &str) -> Vec<u8> {
        let bearer = format!("Bearer {token}");
        request(
            method,
            &format!("/api/rooms/{}/{what}", self.room),
            &self.host,
            &[("Authorization", &bearer)],
            b"",
        )
    }

    async fn call(conn: &mut Conn, stage: &str, req: &[u8]) -> Result<Response, Failure> {
        conn.call(req).await.map_err(|e| Failure::io(stage, &e))
    }

    pub async fn join(&self, conn: &mut Conn) -> Result<Ticket, Failure> {
        let r = Self::call(conn, "join", &self.join_request()).await?;
        if r.status != 201 && r.status != 200 {
            return Err(Failure::http("join", r.status));
        }
        parse_ticket(&r).ok_or_else(|| Failure("join: unreadable answer".into()))
    }

    pub async fn status(&self, conn: &mut Conn, token: &str) -> Result<Value, Failure> {
        let r = Self::call(conn, "status", &self.bearer_request("GET", "status", token)).await?;
        if r.status != 200 {
            return Err(Failure::http("status", r.status));
        }
        r.json()
            .ok_or_else(|| Failure("status: unreadable answer".into()))
    }

    pub async fn leave(&self, conn: &mut Conn, token: &str) -> Result<(), Failure> {
        let r = Self::call(conn, "leave", &self.bearer_request("POST", "leave", token)).await?;
        if r.status != 204 {
            return Err(Failure::http("leave", r.status));
        }
        Ok(())
    }

    /// `true` for a pass let through (204).
    pub async fn gate(&self, conn: &mut Conn, token: &str) -> Result<bool, Failure> {
        let r = Self::call(conn, "gate", &self.gate_request(token)).await?;
        match r.status {
            204 => Ok(true),
            401 => Ok(false),
            s => Err(Failure::http("gate", s)),
        }
    }

    /// The admin view of the room, `None` when the server has no admin API
    /// (404), refuses the token, or answers something unreadable.
    pub async fn admin_room(
        &self,
        conn: &mut Conn,
        admin_token: &str,
    ) -> Result<Option<Value>, Failure> {
        let bearer = format!("Bearer {admin_token}");
        let req = request(
            "GET",
            &format!("/admin/rooms/{}", self.room),
            &self.host,
            &[("Authorization", &bearer)],
            b"",
        );
        let r = Self::call(conn, "admin", &req).await?;
        Ok(if r.status == 200 { r.json() } else { None })
    }
}

impl Api {
    /// The room's Web Push key (`GET /api/rooms/{room}/notify`).
    pub async fn push_key(&self, conn: &mut Conn) -> Result<String, Failure> {
        let req = request(
            "GET",
            &format!("/api/rooms/{}/notify", self.room),
            &self.host,
            &[],
            b"",
        );
        let r = Self::call(conn, "push key", &req).await?;
        if r.status != 200 {
            return Err(Failure::http("push key (is [push] on?)", r.status));
        }
        r.json()
            .and_then(|v| v.get("public_key")?.as_str().map(str::to_owned))
            .ok_or_else(|| Failure("push key: unreadable answer".into()))
    }

    /// Hand a push subscription over with the ticket (`POST notify`).
    pub async fn subscribe(
        &self,
        conn: &mut Conn,
        token: &str,
        subscription: &Value,
    ) -> Result<(), Failure> {
        let body = serde_json::json!({ "subscription": subscription });
        let path = format!("/api/rooms/{}/notify", self.room);
        let req = self.json_request("POST", &path, token, &body);
        let r = Self::call(conn, "subscribe", &req).await?;
        if r.status != 204 {
            return Err(Failure::http("subscribe", r.status));
        }
        Ok(())
    }
}

impl Api {
    /// Change the room through the admin API (`PATCH`); an error unless
    /// the server takes it (200).
    pub async fn admin_patch(
        &self,
        conn: &mut Conn,
        admin_token: &str,
        body: &Value,
    ) -> Result<(), Failure> {
        let path = format!("/admin/rooms/{}", self.room);
        let req = self.json_request("PATCH", &path, admin_token, body);
        let r = Self::call(conn, "admin patch", &req).await?;
        if r.status != 200 {
            return Err(Failure::http("admin patch", r.status));
        }
        Ok(())
    }

    /// A request with a bearer token and a JSON body.
    fn json_request(&self, method: &str, path: &str, token: &str, body: &Value) -> Vec<u8> {
        let bearer = format!("Bearer {token}");
        let body = body.to_string();
        request(
            method,
            path,
            &self.host,
            &[
                ("Authorization", &bearer),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
    }
}

pub fn parse_ticket(r: &Response) -> Option<Ticket> {
    let v = r.json()?;
    Some(Ticket {
        token: v.get("ticket")?.as_str()?.to_owned(),
        number: v.get("number")?.as_u64()?,
        status: v.get("status")?.as_str()?.to_owned(),
    })
}

/// The first number under `key` anywhere in a JSON document (the admin
/// stats' shape is another issue's; this finds `admitted` and `capacity`
/// at the top or nested in `stats`/`view`).
pub fn find_number(v: &Value, key: &str) -> Option<u64> {
    match v {
        Value::Object(map) => map
            .get(key)
            .and_then(Value::as_u64)
            .or_else(|| map.values().find_map(|x| find_number(x, key))),
        Value::Array(items) => items.iter().find_map(|x| find_number(x, key)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_found_nested() {
        let v: Value = serde_json::json!({"id": "a", "view": {"capacity": 5, "admitted": 3}});
        assert_eq!(find_number(&v, "capacity"), Some(5));
        assert_eq!(find_number(&v, "admitted"), Some(3));
        assert_eq!(find_number(&v, "missing"), None);
    }
}

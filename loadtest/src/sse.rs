//! A Server-Sent Events parser fed with whatever bytes arrive: chunks may
//! split lines and events anywhere.

/// One dispatched event (comments and keep-alives are not events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub data: String,
}

#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    event: Option<String>,
    data: Option<String>,
}

impl SseParser {
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        for &b in bytes {
            if b == b'\n' {
                if self.line.last() == Some(&b'\r') {
                    self.line.pop();
                }
                let line = std::mem::take(&mut self.line);
                self.line_done(&line, out);
            } else {
                self.line.push(b);
            }
        }
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.data.is_some() || self.event.is_some() {
                out.push(SseEvent {
                    event: self.event.take().unwrap_or_else(|| "message".to_owned()),
                    data: self.data.take().unwrap_or_default(),
                });
            }
            return;
        }
        if line[0] == b':' {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (text.as_ref(), ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for chunk in input.chunks(piece) {
            p.feed(chunk, &mut out);
        }
        out
    }

    #[test]
    fn events_survive_any_split() {
        let input = b": keep-alive\n\nevent: position\ndata: {\"position\":3}\n\nevent: admitted\r\ndata: a\r\ndata: b\r\n\r\n";
        for piece in 1..input.len() {
            let events = parse_in_pieces(input, piece);
            assert_eq!(
                events,
                vec![
                    SseEvent {
                        event: "position".into(),
                        data: "{\"position\":3}".into()
                    },
                    SseEvent {
                        event: "admitted".into(),
                        data: "a\nb".into()
                    },
                ],
                "split every {piece} bytes"
            );
        }
    }

    #[test]
    fn data_without_a_name_is_a_message() {
        let events = parse_in_pieces(b"data:x\n\n", 100);
        assert_eq!(events[0].event, "message");
        assert_eq!(events[0].data, "x");
    }
}

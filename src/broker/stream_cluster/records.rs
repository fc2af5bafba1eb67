//! What this node holds, recorded in the control state: its streams and
//! consumers announced once a leader is known, its consumers' cursors
//! replicated in batches.

use super::*;
use crate::broker::Broker;

impl Broker {
    /// Once a leader is known after start: tells the cluster about the
    /// streams and consumers this node holds that it does not know of
    /// (streams made before cluster mode, or whose record was lost).
    pub(crate) fn announce_streams(&mut self, sink: &mut dyn Sink) {
        let Some(me) = self.cluster.as_ref().map(|c| c.me()) else {
            return;
        };
        for (name, config, consumers) in self.streams.configs() {
            match self.fsm.streams.get(&name) {
                Some(m) if m.owner != me => {
                    crate::log_warn!(
                        "stream {name:?} is held here but the cluster records it on another node"
                    );
                    continue;
                }
                Some(m) if m.config == config => {}
                _ => self.submit_internal(
                    sink,
                    Cmd::Meta(MetaCommand::StreamPut {
                        name: name.clone(),
                        owner: me,
                        config,
                    }),
                ),
            }
            for (consumer, config) in consumers {
                let known = self
                    .fsm
                    .streams
                    .get(&name)
                    .and_then(|m| m.consumers.get(&consumer))
                    .is_some_and(|c| c.config == config);
                if !known {
                    self.submit_internal(
                        sink,
                        Cmd::Meta(MetaCommand::ConsumerPut {
                            stream: name.clone(),
                            name: consumer,
                            config,
                        }),
                    );
                }
            }
        }
    }

    /// On the owner, every [`CURSOR_EVERY`]: one `Cursors` change per
    /// stream whose consumers moved.
    pub(crate) fn replicate_cursors(&mut self, sink: &mut dyn Sink) {
        if self.cluster.is_none() {
            return;
        }
        let now = sink.now();
        if self.cursor_log.next.is_some_and(|n| n > now) {
            return;
        }
        self.cursor_log.next = Some(now + CURSOR_EVERY);
        let mut moved: HashMap<String, Vec<Cursor>> = HashMap::new();
        for (stream, consumer, floor, delivered) in self.streams.cursors() {
            if self.fsm.stream_owner(&stream).is_none() {
                continue;
            }
            let key = (stream.clone(), consumer.clone());
            if self.cursor_log.sent.get(&key) == Some(&(floor, delivered)) {
                continue;
            }
            self.cursor_log.sent.insert(key, (floor, delivered));
            moved.entry(stream).or_default().push(Cursor {
                consumer,
                pos: CursorPos {
                    ack_floor: floor,
                    delivered,
                },
            });
        }
        for (stream, cursors) in moved {
            self.submit_internal(sink, Cmd::Meta(MetaCommand::Cursors { stream, cursors }));
        }
    }
}

//! Every platform's connector passes the one conformance suite from `botfleet-testkit`,
//! against its fake.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use botfleet_core::{AttachmentKind, BotId, BotSpec, Platform, Secret};
use botfleet_platform::Connector;
use botfleet_testkit::{
    connector_suite::FileOut, FakeSlack, FakeTelegram, Fault, PlatformFixture, Shown,
    SlackSendFault,
};

/// The downloads of every file users sent, as the fake counts them per file.
fn downloads(files: &std::sync::Mutex<Vec<String>>, of: impl Fn(&str) -> usize) -> usize {
    files.lock().unwrap().iter().map(|f| of(f)).sum()
}

struct Telegram {
    fake: FakeTelegram,
    /// Callback query ids of the presses made.
    presses: std::sync::Mutex<Vec<String>>,
    /// The `file_id`s of the files users sent.
    files: std::sync::Mutex<Vec<String>>,
}

impl Telegram {
    async fn new() -> Self {
        Self {
            fake: FakeTelegram::start().await.unwrap(),
            presses: Default::default(),
            files: Default::default(),
        }
    }
    fn token(i: usize) -> String {
        format!("{}:conn-SECRET-{i}", 2000 + i)
    }
}

impl PlatformFixture for Telegram {
    fn platform(&self) -> Platform {
        Platform::Telegram
    }
    fn bot(&self, i: usize) -> BotSpec {
        self.fake.state().add_bot(&Self::token(i));
        let mut spec = BotSpec::new(
            BotId::new(format!("bot-{i}")).unwrap(),
            Platform::Telegram,
            Self::token(i),
        );
        spec.options.api_url = Some(self.fake.url());
        spec
    }
    fn user_writes(&self, i: usize, chat: u32, text: &str) {
        self.fake
            .state()
            .user_writes(&Self::token(i), i64::from(chat), text);
    }
    fn user_commands(&self, i: usize, chat: u32, name: &str, args: &str) -> bool {
        // As a client sends it in a group: addressed to the bot by name.
        self.user_writes(i, chat, &format!("/{name}@fleet_bot {args}"));
        true
    }
    fn user_writes_then_edits(&self, i: usize, chat: u32, text: &str, edited: &str) -> bool {
        let (fake, token) = (self.fake.state(), Self::token(i));
        let id = fake.user_writes(&token, i64::from(chat), text);
        fake.user_edits(&token, i64::from(chat), id, edited);
        true
    }
    fn sent(&self, i: usize) -> Vec<(u32, String)> {
        self.fake
            .state()
            .sent()
            .into_iter()
            .filter(|s| s.token == Self::token(i))
            .map(|s| (s.chat_id.parse().unwrap(), s.text))
            .collect()
    }
    fn revoke(&self, i: usize) {
        self.fake.state().revoke(&Self::token(i));
    }
    fn rate_limit_next_send(&self, i: usize, secs: u64) {
        self.fake
            .state()
            .inject_send(&Self::token(i), Fault::TooManyRequests(secs));
    }
    fn fail_next_send(&self, i: usize) {
        self.fake
            .state()
            .inject_send(&Self::token(i), Fault::ServerError);
    }
    fn requests(&self, i: usize) -> u64 {
        self.fake.state().requests_of(&Self::token(i))
    }
    fn connected(&self, i: usize) -> bool {
        self.fake.state().is_polling(&Self::token(i))
    }
    fn connector(&self) -> Arc<dyn Connector> {
        Arc::new(botfleet_telegram::TelegramConnector::new(Default::default()).unwrap())
    }
    fn secrets(&self, i: usize) -> Vec<String> {
        vec![Self::token(i)]
    }
    fn shown(&self, i: usize) -> Vec<Shown> {
        botfleet_testkit::connector_suite::telegram_shown(self.fake.state(), &Self::token(i))
    }
    fn user_writes_where_streams_are_native(
        &self,
        i: usize,
        chat: u32,
        text: &str,
    ) -> Option<String> {
        // A user's own chat with the bot (private: a positive id).
        self.user_writes(i, chat, text);
        Some(chat.to_string())
    }
    fn native_streams(&self, i: usize) -> Vec<(u32, String, bool)> {
        botfleet_testkit::connector_suite::telegram_streams(self.fake.state(), &Self::token(i))
            .into_iter()
            .map(|(chat, text, on)| (chat.parse().unwrap(), text, on))
            .collect()
    }
    fn pace_edits(&self, every: std::time::Duration) -> bool {
        self.fake.state().pace_edits(Some(every));
        true
    }
    fn edits_paced(&self) -> u64 {
        self.fake.state().edits_paced()
    }
    fn edits(&self, i: usize) -> Vec<(u32, String)> {
        self.fake
            .state()
            .edits(&Self::token(i))
            .into_iter()
            .map(|e| (e.chat_id.parse().unwrap(), e.text))
            .collect()
    }
    fn rate_limit_next_edit(&self, i: usize, secs: u64) {
        self.fake
            .state()
            .inject_edit(&Self::token(i), Fault::TooManyRequests(secs));
    }
    fn user_presses(&self, i: usize, chat: u32, message_id: &str, value: &str) -> bool {
        let Ok(id) = message_id.parse() else {
            return false;
        };
        let pressed = self
            .fake
            .state()
            .user_presses(&Self::token(i), i64::from(chat), id, value);
        if let Some((_, query)) = &pressed {
            self.presses.lock().unwrap().push(query.clone());
        }
        pressed.is_some()
    }
    fn typing_shown(&self, i: usize) -> usize {
        self.fake
            .state()
            .calls(&Self::token(i), "sendChatAction")
            .len()
    }
    fn user_sends_file(
        &self,
        i: usize,
        chat: u32,
        kind: AttachmentKind,
        name: &str,
        mime: &str,
        data: Vec<u8>,
        caption: &str,
    ) -> bool {
        let field = match kind {
            AttachmentKind::Image => "photo",
            AttachmentKind::Video => "video",
            AttachmentKind::Audio => "audio",
            AttachmentKind::Voice => "voice",
            AttachmentKind::Sticker => "sticker",
            AttachmentKind::File => "document",
        };
        let (name, mime) = match kind {
            // A photo has neither on Telegram.
            AttachmentKind::Image => (None, None),
            _ => (Some(name), Some(mime)),
        };
        let caption = (!caption.is_empty()).then_some(caption);
        let (_, file) = self.fake.state().user_sends_file(
            &Self::token(i),
            i64::from(chat),
            field,
            data,
            name,
            mime,
            caption,
        );
        self.files.lock().unwrap().push(file);
        true
    }
    fn file_downloads(&self, _i: usize) -> usize {
        let fake = self.fake.state();
        downloads(&self.files, |f| fake.downloads(f))
    }
    fn registered_commands(&self, i: usize) -> (Option<Vec<String>>, u64) {
        self.fake.state().my_commands(&Self::token(i))
    }
    fn files_sent(&self, i: usize) -> Vec<FileOut> {
        self.fake
            .state()
            .files_sent()
            .into_iter()
            .filter(|s| s.token == Self::token(i))
            .map(|s| FileOut {
                chat: s.chat_id.parse().unwrap(),
                name: s.name,
                data: s.data,
                caption: s.caption,
            })
            .collect()
    }
    fn press_answers(&self, _i: usize) -> Vec<(String, std::time::Duration)> {
        let fake = self.fake.state();
        self.presses
            .lock()
            .unwrap()
            .iter()
            .filter_map(|q| {
                let p = fake.press(q)?;
                let (args, at) = p.answer?;
                Some((
                    args["text"].as_str().unwrap_or_default().to_owned(),
                    at.duration_since(p.at),
                ))
            })
            .collect()
    }
}

struct Slack {
    fake: FakeSlack,
    /// The ids of the files users shared.
    files: std::sync::Mutex<Vec<String>>,
}

impl Slack {
    async fn new() -> Self {
        Self {
            fake: FakeSlack::start().await.unwrap(),
            files: Default::default(),
        }
    }
    fn bot_token(i: usize) -> String {
        format!("xoxb-conn-SECRET-{i}")
    }
    fn app_token(i: usize) -> String {
        format!("xapp-conn-SECRET-{i}")
    }
}

impl PlatformFixture for Slack {
    fn platform(&self) -> Platform {
        Platform::Slack
    }
    fn bot(&self, i: usize) -> BotSpec {
        self.fake
            .state()
            .add_app(&Self::bot_token(i), &Self::app_token(i));
        let mut spec = BotSpec::new(
            BotId::new(format!("bot-{i}")).unwrap(),
            Platform::Slack,
            Self::bot_token(i),
        );
        spec.app_token = Some(Secret::new(Self::app_token(i)));
        spec.options.api_url = Some(self.fake.url());
        spec
    }
    fn user_writes(&self, i: usize, chat: u32, text: &str) {
        self.fake
            .state()
            .user_writes(&Self::bot_token(i), &format!("C{chat}"), None, text);
    }
    fn user_commands(&self, i: usize, chat: u32, name: &str, args: &str) -> bool {
        self.fake.state().user_runs_command(
            &Self::bot_token(i),
            &format!("C{chat}"),
            &format!("/{name}"),
            args,
        );
        true
    }
    fn user_writes_then_edits(&self, i: usize, chat: u32, text: &str, edited: &str) -> bool {
        let (fake, token, channel) = (self.fake.state(), Self::bot_token(i), format!("C{chat}"));
        let ts = fake.user_writes(&token, &channel, None, text);
        fake.user_edits(&token, &channel, &ts, text, edited);
        true
    }
    fn chat_id(&self, chat: u32) -> String {
        format!("C{chat}")
    }
    fn sent(&self, i: usize) -> Vec<(u32, String)> {
        self.fake
            .state()
            .sent()
            .into_iter()
            .filter(|p| p.token == Self::bot_token(i))
            .map(|p| (p.channel.trim_start_matches('C').parse().unwrap(), p.text))
            .collect()
    }
    fn revoke(&self, i: usize) {
        self.fake.state().revoke(&Self::bot_token(i));
    }
    fn rate_limit_next_send(&self, i: usize, secs: u64) {
        self.fake
            .state()
            .inject_send(&Self::bot_token(i), SlackSendFault::TooManyRequests(secs));
    }
    fn fail_next_send(&self, i: usize) {
        self.fake
            .state()
            .inject_send(&Self::bot_token(i), SlackSendFault::ServerError);
    }
    fn pace_edits(&self, every: std::time::Duration) -> bool {
        self.fake.state().pace_updates(Some(every));
        true
    }
    fn edits_paced(&self) -> u64 {
        self.fake.state().updates_paced()
    }
    fn edits(&self, i: usize) -> Vec<(u32, String)> {
        self.fake
            .state()
            .updates(&Self::bot_token(i))
            .into_iter()
            .map(|u| (u.channel.trim_start_matches('C').parse().unwrap(), u.text))
            .collect()
    }
    fn rate_limit_next_edit(&self, i: usize, secs: u64) {
        self.fake
            .state()
            .inject_update(&Self::bot_token(i), SlackSendFault::TooManyRequests(secs));
    }
    fn user_writes_where_streams_are_native(
        &self,
        i: usize,
        chat: u32,
        text: &str,
    ) -> Option<String> {
        // One thread of the channel.
        let (channel, thread) = (format!("C{chat}"), "1700000000.000777");
        self.fake
            .state()
            .user_writes(&Self::bot_token(i), &channel, Some(thread), text);
        Some(format!("{channel}/{thread}"))
    }
    fn refuse_native_streams(&self, i: usize) -> bool {
        self.fake.state().refuse_streams(&Self::bot_token(i));
        true
    }
    fn native_streams_refused(&self, i: usize) -> u64 {
        self.fake.state().streams_refused(&Self::bot_token(i))
    }
    fn native_streams(&self, i: usize) -> Vec<(u32, String, bool)> {
        let (fake, token) = (self.fake.state(), Self::bot_token(i));
        fake.streams(&token)
            .into_iter()
            .filter_map(|(channel, ts)| {
                let p = fake.posted(&token, &channel, &ts)?;
                Some((
                    channel.trim_start_matches('C').parse().unwrap(),
                    p.text,
                    p.streaming,
                ))
            })
            .collect()
    }
    fn requests(&self, i: usize) -> u64 {
        self.fake.state().requests_of(&Self::bot_token(i))
            + self.fake.state().requests_of(&Self::app_token(i))
    }
    fn connected(&self, i: usize) -> bool {
        self.fake.state().sockets(&Self::bot_token(i)) > 0
    }
    fn connector(&self) -> Arc<dyn Connector> {
        Arc::new(botfleet_slack::SlackConnector::new(Default::default()).unwrap())
    }
    fn secrets(&self, i: usize) -> Vec<String> {
        vec![Self::bot_token(i), Self::app_token(i)]
    }
    fn shown(&self, i: usize) -> Vec<Shown> {
        botfleet_testkit::connector_suite::slack_shown(self.fake.state(), &Self::bot_token(i))
    }
    fn user_presses(&self, i: usize, chat: u32, message_id: &str, value: &str) -> bool {
        self.fake
            .state()
            .user_presses(&Self::bot_token(i), &format!("C{chat}"), message_id, value)
            .is_some()
    }
    fn press_answers(&self, i: usize) -> Vec<(String, std::time::Duration)> {
        self.fake
            .state()
            .responses(&Self::bot_token(i))
            .into_iter()
            .map(|r| {
                (
                    r.body["text"].as_str().unwrap_or_default().to_owned(),
                    r.at.duration_since(r.pressed_at),
                )
            })
            .collect()
    }
    fn user_sends_file(
        &self,
        i: usize,
        chat: u32,
        _kind: AttachmentKind,
        name: &str,
        mime: &str,
        data: Vec<u8>,
        caption: &str,
    ) -> bool {
        let (_, id) = self.fake.state().user_shares_file(
            &Self::bot_token(i),
            &format!("C{chat}"),
            name,
            mime,
            data,
            caption,
        );
        self.files.lock().unwrap().push(id);
        true
    }
    fn file_downloads(&self, _i: usize) -> usize {
        let fake = self.fake.state();
        downloads(&self.files, |f| fake.downloads(f))
    }
    fn files_sent(&self, i: usize) -> Vec<FileOut> {
        self.fake
            .state()
            .files_shared()
            .into_iter()
            .filter(|s| s.token == Self::bot_token(i))
            .map(|s| FileOut {
                chat: s.channel.trim_start_matches('C').parse().unwrap(),
                name: Some(s.name),
                data: s.data,
                caption: s.initial_comment,
            })
            .collect()
    }
}

struct Discord {
    fake: botfleet_discord::fake::FakeDiscord,
    /// The ids of the attachments users sent.
    files: std::sync::Mutex<Vec<String>>,
}

impl Discord {
    async fn new() -> Self {
        Self {
            fake: botfleet_discord::fake::FakeDiscord::start().await.unwrap(),
            files: Default::default(),
        }
    }
    fn token(i: usize) -> String {
        format!("DISCORD.conn.SECRET-{i}")
    }
}

impl PlatformFixture for Discord {
    fn platform(&self) -> Platform {
        Platform::Discord
    }
    fn bot(&self, i: usize) -> BotSpec {
        self.fake.state().add_bot(&Self::token(i), 1, 1);
        let mut spec = BotSpec::new(
            BotId::new(format!("bot-{i}")).unwrap(),
            Platform::Discord,
            Self::token(i),
        );
        spec.options.api_url = Some(self.fake.url());
        spec
    }
    fn user_writes(&self, i: usize, chat: u32, text: &str) {
        self.fake
            .state()
            .user_writes(&Self::token(i), u64::from(chat), text);
    }
    fn user_writes_then_edits(&self, i: usize, chat: u32, text: &str, edited: &str) -> bool {
        let (fake, token) = (self.fake.state(), Self::token(i));
        let id = fake.user_writes(&token, u64::from(chat), text);
        fake.user_edits(&token, u64::from(chat), &id, edited);
        true
    }
    fn sent(&self, i: usize) -> Vec<(u32, String)> {
        // Answers to interactions are what the user sees too.
        self.fake
            .state()
            .shown_in_channels(&Self::token(i))
            .into_iter()
            .map(|(channel, text)| (channel.parse().unwrap(), text))
            .collect()
    }
    fn revoke(&self, i: usize) {
        self.fake.state().revoke(&Self::token(i));
    }
    fn rate_limit_next_send(&self, i: usize, secs: u64) {
        self.fake.state().inject_send(
            &Self::token(i),
            botfleet_discord::fake::SendFault::TooManyRequests(secs as f64),
        );
    }
    fn fail_next_send(&self, i: usize) {
        self.fake.state().inject_send(
            &Self::token(i),
            botfleet_discord::fake::SendFault::ServerError,
        );
    }
    fn pace_edits(&self, every: std::time::Duration) -> bool {
        self.fake.state().pace_edits(Some(every));
        true
    }
    fn edits_paced(&self) -> u64 {
        self.fake.state().edits_paced(&Self::token(0))
    }
    fn edits(&self, i: usize) -> Vec<(u32, String)> {
        self.fake
            .state()
            .edits(&Self::token(i))
            .into_iter()
            .map(|e| (e.channel.parse().unwrap(), e.content))
            .collect()
    }
    fn rate_limit_next_edit(&self, i: usize, secs: u64) {
        self.fake.state().inject_edit(
            &Self::token(i),
            botfleet_discord::fake::SendFault::TooManyRequests(secs as f64),
        );
    }
    fn requests(&self, i: usize) -> u64 {
        self.fake.state().requests_of(&Self::token(i))
    }
    fn connected(&self, i: usize) -> bool {
        self.fake.state().connected_shards(&Self::token(i)) > 0
    }
    fn connector(&self) -> Arc<dyn Connector> {
        Arc::new(
            botfleet_discord::DiscordConnector::new(
                Default::default(),
                Arc::new(botfleet_discord::LocalGate::default()),
            )
            .unwrap(),
        )
    }
    fn secrets(&self, i: usize) -> Vec<String> {
        vec![Self::token(i)]
    }
    fn shown(&self, i: usize) -> Vec<Shown> {
        let (fake, token) = (self.fake.state(), Self::token(i));
        fake.sent_by(&token)
            .into_iter()
            .filter_map(|p| {
                let m = fake.message(&token, &p.id)?;
                Some(Shown {
                    chat: p.channel.parse().ok()?,
                    id: p.id,
                    text: m.content,
                    buttons: m.buttons,
                    deleted: m.deleted,
                })
            })
            .collect()
    }
    fn typing_shown(&self, i: usize) -> usize {
        self.fake.state().typing(&Self::token(i)).len()
    }
    fn registered_commands(&self, i: usize) -> (Option<Vec<String>>, u64) {
        let fake = self.fake.state();
        let names = fake.commands(&Self::token(i)).map(|c| {
            c.as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x["name"].as_str().map(str::to_owned))
                .collect()
        });
        (names, fake.command_writes(&Self::token(i)))
    }
    fn user_commands(&self, i: usize, chat: u32, name: &str, args: &str) -> bool {
        self.fake.state().user_runs_command(
            &Self::token(i),
            u64::from(chat),
            name,
            serde_json::json!([{"name": "args", "type": 3, "value": args}]),
        );
        true
    }
    fn user_presses(&self, i: usize, chat: u32, message_id: &str, value: &str) -> bool {
        self.fake
            .state()
            .user_presses(&Self::token(i), u64::from(chat), message_id, value)
            .is_some()
    }
    fn press_answers(&self, i: usize) -> Vec<(String, std::time::Duration)> {
        self.fake
            .state()
            .interactions(&Self::token(i))
            .into_iter()
            .filter(|x| !x.command)
            .flat_map(|x| x.answers.into_iter().map(|a| (a.text, a.after)))
            .collect()
    }
    fn user_sends_file(
        &self,
        i: usize,
        chat: u32,
        _kind: AttachmentKind,
        name: &str,
        mime: &str,
        data: Vec<u8>,
        caption: &str,
    ) -> bool {
        let (_, id) = self.fake.state().user_sends_file(
            &Self::token(i),
            u64::from(chat),
            name,
            mime,
            data,
            caption,
        );
        self.files.lock().unwrap().push(id);
        true
    }
    fn file_downloads(&self, _i: usize) -> usize {
        let fake = self.fake.state();
        downloads(&self.files, |f| fake.downloads(f))
    }
    fn files_sent(&self, i: usize) -> Vec<FileOut> {
        self.fake
            .state()
            .sent_by(&Self::token(i))
            .into_iter()
            .flat_map(|p| {
                let chat = p.channel.parse().unwrap();
                let content = p.content.clone();
                p.files.into_iter().map(move |f| FileOut {
                    chat,
                    name: Some(f.name),
                    data: f.data,
                    caption: Some(content.clone()),
                })
            })
            .collect()
    }
}

mod telegram {
    use super::*;
    botfleet_testkit::connector_conformance!(Telegram::new());

    /// A long turn keeps the chat's typing indicator up (Telegram shows one for 5 s) until
    /// the answer, which is sent once; a bot with `typing: false` shows none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_turn_keeps_typing_up_until_its_answer() {
        use botfleet_testkit::{connector_suite::Harness, wait_for, ScriptedHandler};
        use std::time::{Duration, Instant};
        const TURN_MS: u64 = 60_000;
        let f = Telegram::new().await;
        let handler = ScriptedHandler::start(|_: &serde_json::Value| {
            serde_json::json!({"_delay_ms": TURN_MS, "text": "done thinking"})
        })
        .await;
        let mut bots = [f.bot(0), f.bot(1)];
        bots[1].options.typing = Some(false);
        for b in &mut bots {
            b.handler = botfleet_core::HandlerSpec::Webhook {
                url: handler.url(),
                secret: None,
            };
        }
        let h = Harness::new(&bots).await;
        let w = h.start("a");
        wait_for("connected", Duration::from_secs(15), || async {
            (f.connected(0) && f.connected(1)).then_some(())
        })
        .await;
        let wrote = Instant::now();
        f.user_writes(0, 1, "a hard question");
        f.user_writes(1, 1, "a hard question");
        let answer = wait_for("both answers", Duration::from_secs(100), || async {
            let sent = f.fake.state().sent();
            let of = |i: usize| {
                sent.iter()
                    .find(|s| s.token == Telegram::token(i))
                    .map(|s| s.at)
            };
            of(0).zip(of(1))
        })
        .await;
        let typing: Vec<Instant> = f
            .fake
            .state()
            .calls(&Telegram::token(0), "sendChatAction")
            .iter()
            .map(|c| c.at)
            .collect();
        let mut at = vec![wrote];
        at.extend(&typing);
        let gaps: Vec<Duration> = at.windows(2).map(|p| p[1] - p[0]).collect();
        println!("typing after the message, then between: {gaps:?}");
        assert!(typing.len() >= 14, "{gaps:?}");
        assert!(gaps[0] < Duration::from_secs(3), "{gaps:?}");
        assert!(
            gaps.iter().all(|g| *g <= Duration::from_secs(5)),
            "shown at least every 5 s: {gaps:?}"
        );
        assert!(
            answer.0 - typing[typing.len() - 1] <= Duration::from_secs(5),
            "kept up to the answer"
        );
        assert!(
            typing.iter().all(|t| *t < answer.0),
            "none after the answer"
        );
        assert!(f
            .fake
            .state()
            .calls(&Telegram::token(1), "sendChatAction")
            .is_empty());
        let sent: Vec<(u32, String)> = [f.sent(0), f.sent(1)].concat();
        assert_eq!(sent.len(), 2, "each answered once: {sent:?}");
        assert_eq!(handler.seen().len(), 2, "one call each");
        w.shutdown().await;
    }

    /// Bot 0 answered by `handler`, on worker "a", with the menu `handler` sends for "menu"
    /// ("Pick") shown in chat 3: its harness, its worker and the menu's message id.
    async fn with_menu(
        f: &Telegram,
        handler: &botfleet_testkit::ScriptedHandler,
    ) -> (
        botfleet_testkit::connector_suite::Harness,
        botfleet_testkit::connector_suite::RunningWorker,
        i64,
    ) {
        use std::time::Duration;
        let mut bot = f.bot(0);
        bot.handler = botfleet_core::HandlerSpec::Webhook {
            url: handler.url(),
            secret: None,
        };
        let h = botfleet_testkit::connector_suite::Harness::new(&[bot]).await;
        let w = h.start("a");
        f.user_writes(0, 3, "menu");
        let menu = botfleet_testkit::wait_for("the menu", Duration::from_secs(20), || async {
            f.fake.state().sent().into_iter().find(|s| s.text == "Pick")
        })
        .await;
        (h, w, menu.message_id)
    }

    /// A button press whose handler takes 3.5 s: the query is answered empty first (the
    /// user's client stops spinning), and the handler's late answer comes as a message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_press_stops_the_spinner_and_answers_later() {
        use botfleet_testkit::{wait_for, ScriptedHandler};
        use serde_json::{json, Value};
        use std::time::Duration;
        let f = Telegram::new().await;
        let handler = ScriptedHandler::start(|ev: &Value| match ev["kind"].as_str() {
            Some("action") => json!({"_delay_ms": 3_500, "actions": [
                {"type": "answer", "text": format!("you chose {}", ev["action"]["value"].as_str().unwrap_or("?"))},
            ]}),
            _ => json!({"actions": [{"type": "send", "text": "Pick", "buttons": [[{"text": "A", "value": "a"}]]}]}),
        })
        .await;
        let (_h, w, menu) = with_menu(&f, &handler).await;
        let (_, query) = f
            .fake
            .state()
            .user_presses(&Telegram::token(0), 3, menu, "a")
            .expect("the button");
        let press = wait_for("the press answered", Duration::from_secs(20), || async {
            f.fake.state().press(&query).filter(|p| p.answer.is_some())
        })
        .await;
        let after = press.answered_empty_after().expect("answered empty");
        // 2 s after the press arrived, with slack for a busy machine (it was 8 s).
        assert!(
            after < Duration::from_secs(5),
            "the spinner stops within 5 s: {after:?}"
        );
        botfleet_testkit::connector_suite::until_sent(
            &f,
            0,
            "you chose a",
            Duration::from_secs(20),
        )
        .await;
        assert_eq!(
            f.fake
                .state()
                .calls(&Telegram::token(0), "answerCallbackQuery")
                .len(),
            1,
            "answered once"
        );
        w.shutdown().await;
    }

    /// A press queued behind a slow turn of its chat: its spinner stops from its arrival,
    /// though its own turn starts seconds later; its answer then comes as a message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_press_queued_behind_a_slow_turn_stops_its_spinner_in_time() {
        use botfleet_testkit::ScriptedHandler;
        use serde_json::{json, Value};
        use std::time::Duration;
        let f = Telegram::new().await;
        let handler = ScriptedHandler::start(|ev: &Value| match (ev["kind"].as_str(), ev["text"].as_str()) {
            (Some("action"), _) => json!({"actions": [{"type": "answer", "text": "noted"}]}),
            (_, Some("slow")) => json!({"_delay_ms": 5_000, "text": "slow reply"}),
            _ => json!({"actions": [{"type": "send", "text": "Pick", "buttons": [[{"text": "A", "value": "a"}]]}]}),
        })
        .await;
        let (_h, w, menu) = with_menu(&f, &handler).await;
        f.user_writes(0, 3, "slow");
        let (_, query) = f
            .fake
            .state()
            .user_presses(&Telegram::token(0), 3, menu, "a")
            .expect("the button");
        botfleet_testkit::connector_suite::until_sent(&f, 0, "noted", Duration::from_secs(30))
            .await;
        let press = f.fake.state().press(&query).expect("the press");
        let after = press.answered_empty_after().expect("answered empty");
        assert!(
            after < Duration::from_secs(3),
            "the spinner stops within 3 s of the press, not after the slow turn: {after:?}"
        );
        let sent: Vec<String> = f.sent(0).into_iter().map(|(_, t)| t).collect();
        assert_eq!(sent, ["Pick", "slow reply", "noted"], "in the chat's order");
        w.shutdown().await;
    }
}

mod slack {
    use super::*;
    botfleet_testkit::connector_conformance!(Slack::new());
}

impl botfleet_testkit::connector_suite::DedupingFixture for Discord {
    fn lose_next_send_answer(&self, i: usize) {
        self.fake.state().inject_send(
            &Self::token(i),
            botfleet_discord::fake::SendFault::AnswerLost,
        );
    }
    fn resends_told(&self, i: usize) -> u64 {
        self.fake.state().duplicate_sends(&Self::token(i))
    }
}

mod discord {
    use super::*;
    botfleet_testkit::connector_conformance!(Discord::new());

    /// Discord tells a resend by its nonce: a reply taken before a crash is shown once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reply_taken_before_a_crash_is_not_shown_twice() {
        botfleet_testkit::connector_suite::a_reply_taken_before_a_crash_is_not_shown_twice(
            &Discord::new().await,
        )
        .await;
    }
}

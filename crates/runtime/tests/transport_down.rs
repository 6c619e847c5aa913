//! A bot whose platform stays unreachable from the worker holding it moves to another worker
//! (and stays there a while), instead of waiting where it cannot work.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_testkit::{connector_suite::Harness, wait_for, FakeTelegram, Fault};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_whose_transport_stays_down_moves_to_another_worker() {
    const T: &str = "7001:DOWN-SECRET";
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(T);
    let mut spec = BotSpec::new(BotId::new("wanderer").unwrap(), Platform::Telegram, T);
    spec.options.api_url = Some(fake.url());
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let tune = |c: &mut botfleet_runtime::WorkerConfig| {
        c.transport_down = Duration::from_millis(1500);
    };
    let workers = [h.start_with("a", tune), h.start_with("b", tune)];
    let running = |i: usize| workers[i].metrics.running_now(Platform::Telegram);
    let holder = wait_for("the bot runs", Duration::from_secs(20), || async {
        (0..2).find(|i| running(*i) == 1 && fake.state().is_polling(T))
    })
    .await;
    let other = 1 - holder;
    // The platform fails every request of the holder for a while (the faults run out after
    // the move: the other worker reaches it).
    for _ in 0..4 {
        fake.state().inject(T, Fault::ServerError);
    }
    wait_for("the bot moved", Duration::from_secs(30), || async {
        (running(other) == 1 && running(holder) == 0 && fake.state().is_polling(T)).then_some(())
    })
    .await;
    fake.state().user_writes(T, 5, "still here?");
    wait_for(
        "answered by the new holder",
        Duration::from_secs(20),
        || async {
            fake.state()
                .sent()
                .iter()
                .any(|s| s.text == "still here?")
                .then_some(())
        },
    )
    .await;
    // It stays: the old holder is avoided for this bot.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!((running(other), running(holder)), (1, 0));
    assert_eq!(fake.state().conflicts(), 0);
    for w in workers {
        w.shutdown().await;
    }
}

//! delayq's Redis function library: the Lua source (`src/store/lua/`), put
//! together once, and the two functions it registers.
//!
//! The constants of the queue's rules are not typed into the Lua: they are
//! written ahead of the prelude from `src/rules.rs`, so both engines follow
//! one definition.
//!
//! A function library, unlike a script, is compiled and set up once when it
//! is loaded; a call then runs only its own work. Its name carries a hash of
//! its source, so processes of different delayq versions sharing one Redis
//! each call their own.

use redis::Script;

use crate::rules::{MAX_OPTION_TIME, URGENT_PRIORITY};

const PRELUDE: &str = include_str!("../lua/prelude.lua");
const DISPATCH: &str = include_str!("../lua/batch.lua");

/// The operations of each kind, with their Lua source.
macro_rules! ops {
    ($($name:ident),+ $(,)?) => {
        &[$((stringify!($name), include_str!(concat!("../lua/", stringify!($name), ".lua")))),+]
    };
}

/// What an operation does, which decides what it may do while Redis is over
/// `maxmemory`: puts are refused whole, up front, so a put never leaves a
/// job half written; moves of existing jobs (they free memory or barely
/// change it) and reads still run, so workers can drain a full Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Puts,
    Moves,
    Reads,
}

impl Kind {
    fn ops(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kind::Puts => ops!(put, import),
            Kind::Moves => ops!(
                reserve,
                reserve_job,
                give_back,
                delete,
                release,
                bury,
                touch,
                kick,
                kick_job,
                pause_tube,
                hold_tube,
                release_all,
                tick,
                tube_ref,
                restore_refs,
                ids,
                forget_births,
                forget_counts,
                set_tube,
                reserve_many,
                delete_many,
                set_schedule,
                claim_key,
            ),
            Kind::Reads => ops!(
                peek,
                stats_job,
                stats_tube,
                stats,
                list_tubes,
                inventory,
                live,
                pauses,
                firsts,
                tube_settings,
                schedules,
                export,
                all_settings,
            ),
        }
    }
}

/// The library's functions. A batch of operations normally goes in one call
/// of [`Function::Any`]; lacking `allow-oom`, that call is refused whole
/// while Redis is over `maxmemory`, and then the batch's moves and reads go
/// again in a call of [`Function::Drain`], which has it, and its puts are
/// answered with the refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Function {
    Any,
    Drain,
}

impl Function {
    const ALL: [Function; 2] = [Function::Any, Function::Drain];

    fn suffix(self) -> &'static str {
        match self {
            Function::Any => "any",
            Function::Drain => "drain",
        }
    }

    fn flags(self) -> &'static str {
        match self {
            Function::Any => "",
            Function::Drain => "'allow-oom'",
        }
    }

    fn kinds(self) -> &'static [Kind] {
        match self {
            Function::Any => &[Kind::Puts, Kind::Moves, Kind::Reads],
            Function::Drain => &[Kind::Moves, Kind::Reads],
        }
    }
}

/// The library's source and the names of its functions.
pub(super) struct Library {
    /// What `FUNCTION LOAD` takes.
    pub source: String,
    functions: [String; 2],
}

impl Library {
    /// The library as this build writes it: its name carries a hash of its
    /// source, so processes of different builds sharing a Redis each call
    /// their own functions.
    pub fn new() -> Library {
        let mut body = format!("{}{PRELUDE}\n", rules_header());
        for kind in [Kind::Puts, Kind::Moves, Kind::Reads] {
            for (_, source) in kind.ops() {
                body.push_str(source);
                body.push('\n');
            }
        }
        body.push_str(DISPATCH);
        let hash = Script::new(&body).get_hash().to_owned();
        let name = format!("delayq_{}", &hash[..16]);
        let functions = Function::ALL.map(|f| format!("{name}_{}", f.suffix()));
        let mut source = format!("#!lua name={name}\n{body}\n");
        for f in Function::ALL {
            let allowed: Vec<String> = f
                .kinds()
                .iter()
                .flat_map(|kind| kind.ops())
                .map(|(op, _)| format!("{op}=true"))
                .collect();
            source.push_str(&format!(
                "redis.register_function{{function_name='{}', callback=dispatcher({{{}}}), flags={{{}}}}}\n",
                functions[f as usize],
                allowed.join(", "),
                f.flags(),
            ));
        }
        Library { source, functions }
    }

    /// The name of `f` in Redis.
    pub fn function(&self, f: Function) -> &str {
        &self.functions[f as usize]
    }
}

/// The rules' constants as Lua locals, ahead of the prelude.
fn rules_header() -> String {
    format!(
        "-- From src/rules.rs.\nlocal URGENT = {URGENT_PRIORITY}\nlocal MAX_OPTION_MS = {}\n",
        MAX_OPTION_TIME.as_millis()
    )
}

/// For benchmarks and the tests that call the library directly: delayq's
/// function library (what `FUNCTION LOAD` takes), and one whole command,
/// starting with `FCALL`, that runs `n` operations `op` ("put" or
/// "reserve") in one call, on the tube `bench` under the default prefix:
/// 100-byte ready jobs for `put`. `None` for another `op`. With `n` 0 it
/// is the call's head, to which a test appends operations of its own.
pub fn bench_call(op: &str, n: usize) -> Option<(String, Vec<Vec<u8>>)> {
    let args: Vec<&[u8]> = match op {
        "put" => vec![b"bench", b"", b"0", b"0", b"60000", &[b'x'; 100], b""],
        "reserve" => vec![b"bench:1", b"bench"],
        _ => return None,
    };
    let library = Library::new();
    let tag = "{delayq:}";
    let mut command: Vec<Vec<u8>> = vec![
        b"FCALL".to_vec(),
        library.function(Function::Any).into(),
        b"1".to_vec(),
        format!("{tag}jobs").into(),
        tag.into(),
        (if op == "put" { n } else { 0 }).to_string().into(),
        // The mode: one Redis, no call token.
        Vec::new(),
    ];
    for _ in 0..n {
        command.push(op.into());
        command.extend(args.iter().map(|a| a.to_vec()));
    }
    Some((library.source, command))
}

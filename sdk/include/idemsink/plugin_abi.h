/*
 * idemsink plugin ABI, version 1.
 *
 * This header is the whole contract between the idemsink host and a handler
 * plugin. It is plain C (standard headers only) so that a plugin built by
 * another compiler, or in another language, still loads.
 *
 * A plugin is a shared library exporting one function, IDEMSINK_ENTRY_SYMBOL,
 * that returns a pointer to a static idemsink_plugin descriptor. The symbol
 * name carries the ABI major version: a host refuses a library that exports
 * only the entry of another major version, and names that version.
 *
 * Compatibility rules:
 *  - The descriptor (idemsink_plugin), idemsink_record and idemsink_host_api
 *    start with their own size (struct_size). Fields are only ever appended;
 *    a reader uses a field only if struct_size says it is present.
 *  - Structs that travel in arrays (idemsink_option_decl, idemsink_check,
 *    idemsink_option, idemsink_header, idemsink_sql_param) and idemsink_bytes
 *    carry no size: the reader indexes them by its own sizeof, so their layout
 *    is FROZEN for the whole ABI major. A new field needs a new struct, and
 *    a new array of it appended to the struct (or host API) that carries the
 *    old one.
 *  - The host accepts abi_major == IDEMSINK_ABI_MAJOR and
 *    abi_minor <= its own IDEMSINK_ABI_MINOR.
 *  - No C++ types and no exceptions cross this boundary.
 *
 * Threading: create and destroy are called on threads of the host's own
 * (start-up, shutdown, a config reload's), never the engine thread or a
 * database worker. A reload that changes a route's options creates a new
 * instance beside the old one; the old one is destroyed once its calls have
 * reported or passed their deadline. invoke and reconcile are called on the host's engine thread and
 * must not block: do the I/O on a thread or event loop of the plugin's own.
 * apply is called on a database worker thread, inside the transaction it
 * writes through. A completion may be reported from any thread, at most once,
 * and possibly before invoke returns.
 *
 * Memory: every pointer documents its OWNERSHIP and LIFETIME. "host-owned,
 * call-scoped" means valid only until the function it was passed to returns;
 * copy what you keep.
 */
#ifndef IDEMSINK_PLUGIN_ABI_H
#define IDEMSINK_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IDEMSINK_ABI_MAJOR 1
#define IDEMSINK_ABI_MINOR 3

/** The exported entry function of this ABI major version, as an identifier
 *  (to define it) and as a string (to look it up). */
#define IDEMSINK_ENTRY_NAME idemsink_plugin_entry_v1
#define IDEMSINK_STRINGIFY_(x) #x
#define IDEMSINK_STRINGIFY(x) IDEMSINK_STRINGIFY_(x)
#define IDEMSINK_ENTRY_SYMBOL IDEMSINK_STRINGIFY(IDEMSINK_ENTRY_NAME)

#if defined(_WIN32)
#define IDEMSINK_EXPORT __declspec(dllexport)
#else
#define IDEMSINK_EXPORT __attribute__((visibility("default")))
#endif

/**
 * What kind of side effect the handler performs. The core derives the retry
 * and crash-recovery policy from it; a plugin cannot opt out.
 */
typedef enum idemsink_kind {
  /** Remote call that de-duplicates on the idem_token (waybill API,
   *  inventory RPC). Retried after a timeout with the same token. */
  IDEMSINK_KIND_REMOTE_IDEMPOTENT = 1,
  /** Remote call without idempotency (SMS gateway). Never retried after
   *  an uncertain outcome: such a record becomes `unknown`. */
  IDEMSINK_KIND_REMOTE_AT_MOST_ONCE = 2,
  /** Write to the business database inside the host's transaction, which
   *  also marks the claim done: exactly once by construction. */
  IDEMSINK_KIND_LOCAL_TX = 3
} idemsink_kind;

/** The result a handler reports for one record. */
typedef enum idemsink_outcome {
  /** Applied. The detail is the receipt (waybill number, message id). */
  IDEMSINK_OUTCOME_OK = 0,
  /** Certainly not applied (connection refused, 503 before processing).
   *  The detail is the error message. A detail beginning
   *  "retry-after=<N>ms" (decimal milliseconds) says the remote asked for a
   *  pause (429/503 with Retry-After): the host holds the route's calls that
   *  long (route.rate_limit.max_hold at most) and does not count the call
   *  toward max_attempts. A convention of the detail, not a new outcome, so
   *  that hosts that predate it read a plain retryable outcome. */
  IDEMSINK_OUTCOME_RETRYABLE = 1,
  /** May or may not have been applied (timeout after sending). */
  IDEMSINK_OUTCOME_UNCERTAIN = 2,
  /** Rejected for good (4xx business rejection). Not retried. */
  IDEMSINK_OUTCOME_PERMANENT = 3
} idemsink_outcome;

/** Log levels for idemsink_host_api.log. */
typedef enum idemsink_log_level {
  IDEMSINK_LOG_DEBUG = 1,
  IDEMSINK_LOG_INFO = 2,
  IDEMSINK_LOG_WARN = 3,
  IDEMSINK_LOG_ERROR = 4
} idemsink_log_level;

/** Types of handler options. The host validates values against them. */
typedef enum idemsink_option_type {
  IDEMSINK_OPTION_STRING = 1,
  IDEMSINK_OPTION_INT = 2,     /**< passed as decimal text */
  IDEMSINK_OPTION_FLOAT = 3,   /**< passed as decimal text */
  IDEMSINK_OPTION_BOOL = 4,    /**< passed as "true" or "false" */
  IDEMSINK_OPTION_DURATION = 5 /**< configured as "250ms", "2s", "1m"; passed as milliseconds */
} idemsink_option_type;

/**
 * Declaration of one handler option. The host rejects unknown option names
 * and values of the wrong type before the plugin is created, and prints the
 * declarations in `idemsink plugin-info`.
 *
 * Layout FROZEN for ABI major 1: the descriptor passes an array of these and
 * arrays carry no per-element size, so this struct can never grow. A future
 * field needs a new struct and a new descriptor field appended after it.
 */
typedef struct idemsink_option_decl {
  const char* name; /**< plugin-owned, static */
  idemsink_option_type type;
  const char* default_value; /**< plugin-owned, static; NULL = required */
  const char* doc;           /**< plugin-owned, static; one sentence */
} idemsink_option_decl;

/**
 * A reconciliation check a plugin ships for its business tables: a query
 * returning one row per problem found (e.g. one biz_key credited twice).
 * `idemsink reconcile --check` runs every check of every route and exits
 * non-zero if any returns a row, so it can drive an alert.
 *
 * Layout FROZEN for ABI major 1: the descriptor passes an array of these and
 * arrays carry no per-element size, so this struct can never grow. A future
 * field needs a new struct and a new descriptor field appended after it.
 */
typedef struct idemsink_check {
  const char* name; /**< plugin-owned, static; e.g. "duplicate_credits" */
  const char* sql;  /**< plugin-owned, static; a SELECT */
  const char* doc;  /**< plugin-owned, static; what a row means */
} idemsink_check;

/**
 * One validated option value, in the canonical text form of its type.
 *
 * Layout FROZEN for ABI major 1: create() receives an array of these and
 * arrays carry no per-element size, so this struct can never grow.
 */
typedef struct idemsink_option {
  const char* name;  /**< host-owned, call-scoped (create) */
  const char* value; /**< host-owned, call-scoped (create) */
} idemsink_option;

/**
 * A byte string that may contain NUL bytes.
 *
 * Layout FROZEN for ABI major 1: it is embedded in frozen structs and passed
 * in arrays (tx_query columns), so it can never grow.
 */
typedef struct idemsink_bytes {
  const char* data; /**< may be NULL when len == 0 */
  size_t len;
} idemsink_bytes;

/**
 * One Kafka record header.
 *
 * Layout FROZEN for ABI major 1: the record passes an array of these and
 * arrays carry no per-element size, so this struct can never grow. A future
 * field needs a new struct and a new record field appended after it.
 */
typedef struct idemsink_header {
  const char* name;     /**< NUL-terminated */
  idemsink_bytes value; /**< data NULL for a null header value */
} idemsink_header;

/**
 * The record handed to a handler. Host-owned, call-scoped: valid until
 * invoke/apply/reconcile returns, NOT until the completion is reported.
 */
typedef struct idemsink_record {
  uint32_t struct_size;
  const char* route; /**< route name = claim namespace */
  const char* topic;
  int32_t partition;
  int64_t offset;
  int64_t timestamp_ms;   /**< Kafka record timestamp */
  idemsink_bytes key;     /**< Kafka message key */
  idemsink_bytes value;   /**< Kafka message value */
  idemsink_bytes biz_key; /**< business key the claim is held on */
  const idemsink_header* headers;
  size_t header_count;
  /** Stable idempotency token (UUID text, NUL-terminated). Committed to
   *  the claim table before the first call and identical on every retry,
   *  restart and takeover: send it to the remote as its idempotency key. */
  const char* idem_token;
  /** 1 for the first call of this record, 2 for the first retry, ... */
  uint32_t attempt;
  /* --- ABI v1.1: present when struct_size covers it --- */
  /** How long the host waits for this call's report, in milliseconds from
   *  the moment invoke/reconcile is called; 0 when not given. Past it the
   *  host takes the call as uncertain. A request not yet on the wire by then
   *  must never be sent later (report it RETRYABLE: it certainly did not
   *  happen): the host may already have asked the remote about it, been told
   *  "never sent" and sent it again. */
  int64_t timeout_ms;
  /* --- ABI v1.2: present when struct_size covers it --- */
  /** The value as JSON: decoded from the format the route names
   *  ([route.value] avro, protobuf or json_schema; dead letters keep `value`
   *  as written), or `value` itself when the route reads JSON. data is NULL
   *  when the route reads its values as string or bytes. */
  idemsink_bytes value_json;
  /** The key as JSON likewise ([route.key_format]); data NULL unless the
   *  route reads its keys as JSON or a registry format. */
  idemsink_bytes key_json;
} idemsink_record;

/**
 * Completion callback. Report exactly once per invoke/apply/reconcile, from
 * any thread, possibly before the call returns. `detail` is the receipt for
 * IDEMSINK_OUTCOME_OK and an error message otherwise; caller-owned and
 * call-scoped (the host copies it). A second report, or a report after the
 * host's per-call deadline, is ignored and logged by the host.
 */
typedef void (*idemsink_complete_fn)(void* call_ctx, idemsink_outcome outcome, const char* detail, size_t detail_len);

/** Opaque handle to the host's open database transaction (local_tx). */
typedef struct idemsink_tx idemsink_tx;

/** Types of SQL parameters bound to `?` placeholders. */
typedef enum idemsink_sql_type {
  IDEMSINK_SQL_NULL = 0,
  IDEMSINK_SQL_INT = 1,    /**< uses `i` */
  IDEMSINK_SQL_DOUBLE = 2, /**< uses `d` */
  IDEMSINK_SQL_TEXT = 3,   /**< uses `bytes`, UTF-8 */
  IDEMSINK_SQL_BLOB = 4    /**< uses `bytes`, any bytes */
} idemsink_sql_type;

/**
 * One bound SQL parameter. Caller-owned, call-scoped.
 *
 * Layout FROZEN for ABI major 1: tx_execute and tx_query take an array of
 * these and arrays carry no per-element size, so this struct can never grow.
 * A future field needs a new struct and new host functions appended to
 * idemsink_host_api.
 */
typedef struct idemsink_sql_param {
  idemsink_sql_type type;
  int64_t i;
  double d;
  idemsink_bytes bytes;
} idemsink_sql_param;

/**
 * Row callback for tx_query: one call per row. Values are host-owned and
 * valid only during the callback; a NULL column has data == NULL.
 */
typedef void (*idemsink_row_fn)(void* row_ctx, size_t column_count, const idemsink_bytes* columns);

/** What tx_write_row does with a row (idemsink_row.kind). */
typedef enum idemsink_row_kind {
  /** INSERT the row. */
  IDEMSINK_ROW_INSERT = 1,
  /** INSERT the row, or, when its unique key exists, update that row's
   *  other columns as idemsink_row.updates says (INSERT ... ON DUPLICATE KEY
   *  UPDATE): an update by key that also creates a missing row. */
  IDEMSINK_ROW_UPSERT = 2
} idemsink_row_kind;

/** How an upserted row changes a column of the row it finds. */
typedef enum idemsink_column_update {
  IDEMSINK_COLUMN_SET = 1, /**< column = the value */
  IDEMSINK_COLUMN_ADD = 2  /**< column = column + the value (a balance, a count) */
} idemsink_column_update;

/**
 * One row for tx_write_row (ABI v1.3). Caller-owned, call-scoped: the host
 * copies the names and values before tx_write_row returns.
 *
 * Names (table, columns) are identifiers, not SQL: letters, digits, `_` and
 * `$`, at most 64 of them, optionally `database.table`; the host quotes them.
 * Values are bound to placeholders, never spliced into the statement.
 */
typedef struct idemsink_row {
  uint32_t struct_size; /**< sizeof(idemsink_row) as the plugin built it */
  int32_t kind;         /**< an idemsink_row_kind (fixed width, unlike an enum) */
  const char* table;
  const char* const* columns;       /**< column_count names */
  const idemsink_sql_param* values; /**< column_count values, in the columns' order */
  size_t column_count;
  /** UPSERT: the first key_count columns are the row's unique key (the
   *  host orders a batch's rows by them); INSERT: 0. */
  size_t key_count;
  /** UPSERT: one idemsink_column_update per column after the key, in their
   *  order; INSERT: NULL. An array: int32_t elements, FROZEN width. */
  const int32_t* updates;
} idemsink_row;

/**
 * Services the host offers the plugin. Host-owned; valid from create until
 * destroy returns, so a plugin may keep the pointer.
 */
typedef struct idemsink_host_api {
  uint32_t struct_size;
  void* host_ctx; /**< pass back as the first argument */

  /** Write one line to the host's log, tagged with the plugin's name. */
  void (*log)(void* host_ctx, idemsink_log_level level, const char* msg, size_t msg_len);

  /**
   * Execute one statement with `?` placeholders inside the transaction of a
   * local_tx apply call. Returns 0 on success and fills *affected_rows
   * (may be NULL); on failure returns the server error number and writes a
   * message to err (err_cap bytes, always NUL-terminated). Only valid during
   * apply, on the tx it received.
   */
  int (*tx_execute)(idemsink_tx* tx, const char* sql, const idemsink_sql_param* params, size_t param_count,
                    uint64_t* affected_rows, char* err, size_t err_cap);

  /** Like tx_execute for a statement returning rows: on_row is called once
   *  per row before tx_query returns. */
  int (*tx_query)(idemsink_tx* tx, const char* sql, const idemsink_sql_param* params, size_t param_count,
                  idemsink_row_fn on_row, void* row_ctx, char* err, size_t err_cap);

  /* --- ABI v1.3: present when struct_size covers it --- */

  /**
   * Queues one row to be written in the apply's transaction, only if this
   * record's outcome is OK; the claim is marked done in the same
   * transaction. Usually the host writes the batch's rows of one kind,
   * table, column list and updates together after the last apply, in
   * multi-row statements, shapes in the order first named, an UPSERT's rows
   * in the byte order of their keys (concurrent batches then lock shared
   * rows in one order, as far as byte order is the key's order: not for a
   * case-insensitive collation, nor for one key bound as INT in one batch
   * and TEXT in another); when the batch must run one record at a time, a
   * record's rows are written after its own apply. So whether a later
   * tx_execute or tx_query of the batch sees a queued row is unspecified:
   * never read what you queue. Its result is not reported: use it for writes
   * whose success does not decide the outcome (a journal entry, a balance).
   * A row the server refuses as written (its data, a duplicate key, a
   * missing referenced row) dead-letters its record as db_rejected (the host
   * finds it by running the batch again, one record at a time, each in a
   * savepoint); the batch's other records commit.
   * Returns 0, or an error number with a message in err when the row itself
   * is malformed (a name that is not an identifier, a count that does not
   * match, a row larger than the server's max_allowed_packet). Only valid
   * during apply, on the tx it received.
   */
  int (*tx_write_row)(idemsink_tx* tx, const idemsink_row* row, char* err, size_t err_cap);
} idemsink_host_api;

/**
 * The descriptor returned by the entry function. Plugin-owned and static: it
 * must stay valid while the library is loaded.
 */
typedef struct idemsink_plugin {
  uint32_t struct_size; /**< sizeof(idemsink_plugin) as the plugin built it */
  uint16_t abi_major;   /**< IDEMSINK_ABI_MAJOR the plugin was built with */
  uint16_t abi_minor;   /**< IDEMSINK_ABI_MINOR the plugin was built with */

  const char* name;        /**< short identifier, e.g. "waybill" */
  const char* version;     /**< the plugin's own version, e.g. "1.2.0" */
  const char* description; /**< one line */
  /** Fixed width, unlike an enum, whose size is the compiler's choice. */
  int32_t kind; /**< an idemsink_kind */

  const idemsink_option_decl* options; /**< may be NULL if option_count == 0 */
  size_t option_count;

  /** DDL the plugin's business tables need (local_tx), applied by
   *  `idemsink schema apply`. Statements must be idempotent
   *  (CREATE TABLE IF NOT EXISTS). May be NULL if schema_count == 0. */
  const char* const* schema;
  size_t schema_count;

  /** Reconciliation checks; may be NULL if check_count == 0. */
  const idemsink_check* checks;
  size_t check_count;

  /**
   * Create one handler instance from validated options. Returns 0 and sets
   * *instance, or non-zero with a message in err (err_cap bytes, always
   * NUL-terminated). `host` stays valid until destroy returns.
   */
  int (*create)(const idemsink_host_api* host, const idemsink_option* options, size_t option_count, void** instance,
                char* err, size_t err_cap);

  /** Destroy an instance. The host calls it only after every invoke has
   *  reported completion or passed its deadline. */
  void (*destroy)(void* instance);

  /**
   * Remote kinds: start the side effect for one record and return without
   * blocking; report the result through done(call_ctx, ...). Required for
   * remote kinds, NULL for local_tx.
   */
  void (*invoke)(void* instance, const idemsink_record* record, idemsink_complete_fn done, void* call_ctx);

  /**
   * local_tx: perform the business write through host->tx_execute on `tx`
   * and report through done() before returning. OK commits the write with
   * the claim; any other outcome rolls the write back (UNCERTAIN is treated
   * as RETRYABLE: a rolled-back write certainly did not happen). Required
   * for local_tx, NULL otherwise. Runs on a host database thread: do not block
   * on anything but the database.
   */
  void (*apply)(void* instance, const idemsink_record* record, idemsink_tx* tx, idemsink_complete_fn done,
                void* call_ctx);

  /**
   * Optional: "did the side effect of this record happen?", asked for
   * `unknown` and stuck rows. Report OK (applied; detail = receipt),
   * PERMANENT (certainly not applied) or RETRYABLE (cannot tell now).
   * Remote kinds only: a local_tx write commits with its claim, so it is
   * never uncertain. Same threading rules as invoke.
   */
  void (*reconcile)(void* instance, const idemsink_record* record, idemsink_complete_fn done, void* call_ctx);
} idemsink_plugin;

/** Signature of the exported entry function. */
typedef const idemsink_plugin* (*idemsink_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* IDEMSINK_PLUGIN_ABI_H */

/* Tool calls as each template writes them: Qwen's Hermes form (chat_tools.c, which also dispatches) and Llama 3.1's
 * JSON form (chat_tools_json.c). Internal to src/data. */
#ifndef DT_DATA_CHAT_TOOLS_INTERNAL_H
#define DT_DATA_CHAT_TOOLS_INTERNAL_H

#include "dtrain/data.h"

struct cJSON;
/* Call k of message i (OpenAI's {"function": {"name", "arguments"}}, or the function itself): its name and its
 * arguments, an object (*parsed: the object parsed from the arguments' JSON text, which the caller deletes; NULL where
 * they were an object). */
dt_status dt_chat_call_parts(const struct cJSON *call, int i, int k, const char **name, const struct cJSON **args,
                             struct cJSON **parsed);
/* Llama 3.1's turns before the messages (its system turn with "Environment: ipython", then the first user message with
 * the tools, or the tools in the system turn): system the chat's system message (NULL: none), user the message that
 * the tools go with (NULL: none, an error; at index i) into *out; *with_user whether user was written. */
dt_status dt_chat_json_tools_turn(const dt_chat_template *t, const struct cJSON *tools, const char *system, const struct cJSON *user,
                                  int i, const dt_chat_kwargs *kw, char **out, bool *with_user);
/* An answer's one call as Llama 3.1 writes it, {"name": NAME, "parameters": ARGS}, or a built-in tool's (its name in
 * builtin) <|python_tag|>NAME.call(ARG="VALUE", ...), replacing the text so far. */
dt_status dt_chat_json_tool_call(const struct cJSON *calls, const struct cJSON *builtin, int i, char **buf, size_t *len, size_t *cap);
/* Llama 3.1's system turn's opening with built-in tools: "Environment: ipython", then "Tools: " and their names but
 * code_interpreter's, appended. */
dt_status dt_chat_builtin_line(const struct cJSON *builtin, char **buf, size_t *len, size_t *cap);
/* A tool's result (message m, at i) as an ipython turn, its content as tojson writes it. */
dt_status dt_chat_json_tool_result(const dt_chat_template *t, const struct cJSON *m, int i, char **out);

#endif

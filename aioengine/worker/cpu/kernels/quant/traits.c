#include "traits.h"

#include "blocks.h"

/* indexed by ggml type id; a new type is one line here */
static const qk_traits *const TYPES[] = {
    [T_Q2_K] = &qk_q2_k,
    [T_Q3_K] = &qk_q3_k,
    [T_Q4_0] = &qk_q4_0,
    [T_Q4_1] = &qk_q4_1,
    [T_Q5_0] = &qk_q5_0,
    [T_Q5_1] = &qk_q5_1,
    [T_Q8_0] = &qk_q8_0,
    [T_Q4_K] = &qk_q4_k,
    [T_Q5_K] = &qk_q5_k,
    [T_Q6_K] = &qk_q6_k,
};

const qk_traits *qk_traits_of(int t) {
    if (t < 0 || t >= (int)(sizeof(TYPES) / sizeof(TYPES[0]))) return 0;
    return TYPES[t];
}

/* block values, block bytes and x8 group-block bytes of type t (0: not computed here), for the
 * Python side's check of its own table */
int qk_type_info(int t, int64_t *info) {
    const qk_traits *tr = qk_traits_of(t);
    if (!tr) return E_TYPE;
    info[0] = tr->block;
    info[1] = tr->bytes;
    info[2] = tr->x8_group_bytes;
    return E_OK;
}

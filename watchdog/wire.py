"""The slot file format (public API).

Its home is ``watchdog.contracts.slot`` (the layout, the seqlock, the encoders and
readers); this module re-exports its public names under the name the README
documents, so code that reads or writes slot files outside this package keeps one
stable import.
"""

from watchdog.contracts.slot import *  # noqa: F403 (the re-export is the point)

# a word per name keeps the 161 names on 24 lines
__all__ = """
    MAGIC VERSION READABLE_VERSIONS WORD HEADER_WORDS IDENTITY_OFFSET IDENTITY_FIELD_BYTES
    IDENTITY_FIELDS RING_OFFSET RECORD_WORDS DEFAULT_RING_CAPACITY MAX_RING_CAPACITY
    EVENT_RING_FACTOR SLOT_SUFFIX FR_DUMP_SUFFIX H_MAGIC H_VERSION H_RING_OFFSET H_RING_CAPACITY
    H_RECORD_WORDS H_SEQ H_PID H_PROC_START_US H_RANK H_LOCAL_RANK H_WORLD_SIZE H_CREATED_WALL_NS
    H_CREATED_MONO_NS H_STATUS H_EVENT_RING_OFFSET H_EVENT_RING_CAPACITY H_STEP H_STEP_START_NS
    H_LAST_STEP_NS H_LAST_DATA_NS H_LAST_COLL_NS H_TOTAL_STEP_NS H_TOTAL_DATA_NS H_TOTAL_COLL_NS
    H_PHASE H_PHASE_SINCE_NS H_DATA_ENTER_NS H_DATA_EXIT_NS H_COLL_GROUP H_COLL_SEQ H_COLL_OP
    H_COLL_BYTES H_COLL_ENTER_NS H_COLL_EXIT_NS H_COLL_OUTSTANDING H_COLL_DONE_SEQ H_PG_STATE
    H_PG_CHANGE_NS H_HOOK_ERRORS H_RING_HEAD H_LOSS_BITS H_LOSS_STEP H_LOSS_BAD_STEP
    H_LOSS_BAD_COUNT H_TOTAL_COLL_BYTES H_BATCH_PER_RANK H_FR_NEWEST_GROUP H_FR_NEWEST_SEQ
    H_LAST_DYNAMIC H_TOTAL_FWD_NS H_TOTAL_BWD_NS H_TOTAL_OPT_NS H_TOTAL_H2D_NS H_SPLIT_LAST
    H_FR_READ_NS H_EVENT_RING_HEAD H_HEARTBEAT_NS H_HEARTBEAT_COUNT H_CTRL_SEQ H_CTRL_CMD H_CTRL_ARG
    H_PROC_START_TICKS H_CTRL_ACK_SEQ H_CTRL_ACK_RESULT H_CTRL_ACK_STEP H_CTRL_ACK_NS
    PROGRESS_OFFSET P_FIRST P_TRAIN_FORWARDS P_EVAL_FORWARDS P_BACKWARDS P_OPTIMIZER_STEPS
    P_PROGRESS_NS P_AUTO_PHASE P_AUTO_SINCE_NS P_AUTO_COUNT P_LAST PROGRESS_WORDS P_FRAME_STEP
    P_FRAME_NS P_FRAME_TEXT FRAME_WORDS FRAME_TEXT_BYTES encode_frame decode_frame LOSS_WORDS
    SPLIT_WORDS SPLIT_PARTS FR_READ_WORDS seqlocked loss_bits loss_value R_INDEX R_KIND R_T_NS
    R_STEP R_A R_B R_C R_D R_E R_F R_G R_H R_I R_J R_K R_L Status Phase CollOp PgState RecordKind
    Clock CollState DTYPES SHAPE_DIM_BITS SHAPE_MAX_DIMS pack_shape unpack_shape Command group_key
    event_ring_offset slot_size slot_filename rollback_filename fr_dump_filename Identity init_slot
    SlotError CorruptSlot UnsupportedVersion TornRead NotRegular SymlinkSlot ForeignSlot Record
    SlotHeader decode_header decode_records SlotSnapshot open_slot_file read_header_consistent
    read_slot write_control list_slot_files
""".split()  # noqa: SIM905

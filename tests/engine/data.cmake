# Token data sets, `tripod data prepare` and the data CLI.
tpd_add_gtest(test_data LABEL unit TIMEOUT 60
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data.cc
  LIBS tpd_engine)

# GPT-2 byte-level BPE against Hugging Face `tokenizers` on a small trained vocabulary
# (bpe/), byte round trips, file errors, and data prepare with it.
tpd_add_gtest(test_tokenizer LABEL unit TIMEOUT 60
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.cc
  LIBS tpd_engine)
target_compile_definitions(test_tokenizer PRIVATE
  TPD_BPE_DIR="${CMAKE_CURRENT_LIST_DIR}/bpe")
add_test(NAME bpe_flow
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/bpe_flow.sh $<TARGET_FILE:tripod>
                 ${CMAKE_CURRENT_LIST_DIR}/bpe)
set_tests_properties(bpe_flow PROPERTIES LABELS unit TIMEOUT 120)

# Blended data sets (Megatron's weighted data paths).
tpd_add_gtest(test_data_blend LABEL unit TIMEOUT 60
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_blend.cc
  LIBS tpd_engine)

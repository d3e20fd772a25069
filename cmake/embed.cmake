# Turns a text file into a C string constant (the report's page script and
# style live as ordinary .js/.css files and are compiled into dtrain).
# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake
file(READ "${IN}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}" "/* generated from ${IN} by cmake/embed.cmake */\nconst char ${NAME}[] = {${body}0x00};\n")
